"""The HTTP API of ``attnkit serve``: every trained model behind one FastAPI app, decoding in one worker thread that
gathers concurrent requests into batches (:mod:`attnkit.serve.worker`).

Endpoint contract (JSON in, JSON out; every field not marked required has the default shown)
=============================================================================================

Common rules
------------
* Every ``POST /v1/*`` body may name ``"model"``: one of ``GET /v1/models``' names. A request naming none gets the
  first model the server was started with where that model answers the endpoint, else the first that does (a
  generate request goes to the language model of a server whose first model translates). An unknown name is
  404; a model that cannot answer the endpoint, 422.
* ``GET /openapi.json`` describes this server: per endpoint the models that answer it and their limits, every
  status with its schema; what JSON Schema cannot say (tokens per text, relations between fields) in
  ``x-max-tokens`` and ``x-rules`` (:mod:`attnkit.serve.openapi`).
* Integers are JSON Schema's: ``3`` and ``3.0`` are the same integer, ``3.5`` is none.
* Errors are one line of JSON, ``{"error": "<field>: <what is wrong>"}``, never a traceback:
  400 malformed body (not JSON, not an object), 401 missing or wrong API key, 404 unknown model or path,
  405 wrong method (with ``Allow``: the path's methods), 408 a body not received whole within ``--body-timeout`` (10 s),
  413 too large (body bytes, sentences per request, tokens per sentence, image bytes or pixels),
  422 a field of the wrong type or value, an unknown field, or a model that cannot do what was asked,
  429 the queue is full (header ``Retry-After: <seconds>``), 500 an internal error (logged by the server),
  504 the request's time limit (``--timeout``) passed.
* API key (when the server has one: ``--api-key`` or ``ATTNKIT_API_KEY``): ``/v1/*`` and ``/metrics`` need
  the header ``Authorization: Bearer KEY`` or ``X-API-Key: KEY``. ``/``, ``/health``, ``/docs`` and
  ``/openapi.json`` need none.
* Token lists are the model's pieces (subwords, words or characters), e.g. ``["▁Ein", "▁Hund", "</s>"]``.
  Attention weights are floats rounded to ``precision`` decimals (attention endpoint) or 4.
* Layers and heads are numbered from 0 everywhere.
* Size limits (:class:`attnkit.serve.Settings`; the first three are options of ``attnkit serve``): source tokens
  per sentence 256 (``--max-source-tokens``), batch tokens 4000 (``--max-batch-tokens``), admitted requests 256
  (``--queue-size``), sentences or texts per request 64, beam 16, generate's max_tokens 1024, JSON body 1 MiB,
  image 10 MiB and 25 million pixels (width x height).
* A client that disconnects before its answer frees its place in the queue at once; its request is logged in
  ``/metrics`` with status 499, and its decoding stops when no other request shares the batch.
* Requests name models, never files: no request reads or writes a path; the only files served are the
  explorer's own (``/``), and images are decoded from the request's bytes.

Uploads (``multipart/form-data``): an input kind whose inputs are files declares its endpoint, its form's fields and
their limits (:class:`attnkit.kinds.upload.Upload`); one handler serves every such endpoint: a file field is
required and not empty (else 422) and at most its size limit (else 413), an integer in its range, a boolean
``true``/``false``/``1``/``0``/``yes``/``no``/``on``/``off``, a field the endpoint does not declare 422; a body that
is not a multipart form 400. ``model`` (empty: as absent) names the model, as in JSON bodies.

Streaming (``"stream": true`` on translate and generate, the form field ``stream=true`` on transcribe): the answer is
``text/event-stream``; each event is ``event: <name>\\ndata: <one line of JSON>\\n\\n``. Names: ``step`` (one
per decided token), ``done`` (last; its data is exactly the non-streaming answer), ``error`` (last; ``{"error": ...,
"status": <http status>}``, e.g. a timeout mid-stream). A client that disconnects frees its place in the queue,
and its decoding stops when no other request shares the batch.

GET /health
    -> ``{"status": "ok", "models": ["name", ...], "queue": <requests waiting>, "in_flight": <admitted requests>,
    "uptime_s": 12.3}``

GET /v1/models
    -> ``{"models": [{"name": "multi30k_en_de", "family": "transformer", "default": true,
    "capabilities": ["align", "attention", "score", "translate"], "path": "/abs/checkpoint/dir",
    "decode": {"beam": 5, "len_penalty": 1.0, "max_len_a": 1.2, "max_len_b": 10},
    "attention": {"encoder": {"layers": 6, "heads": 8}, "decoder": {"layers": 6, "heads": 8},
    "cross": {"layers": 6, "heads": 8}},      # {"layers": 0, "heads": 0} where the family has none
    "grid": null,                             # captioners: [height, width] of the image grid
    "positional": "sinusoidal",              # or "learned", or null (RNNs, Show-Attend-Tell)
    "max_positions": 256,
    "example": "A dog is running through the grass."}]}``   # a first input (a prompt; null for captioners)
    A classifier's entry has ``"decode": null``, ``"attention": {"encoder": {"layers": 6, "heads": 12}}``, and
    ``"labels": ["0", "1"]`` (a regressor's: ``["score"]``), ``"problem": "classification"`` (or ``"regression"``),
    ``"pairs": false`` (whether it reads sentence pairs) and ``"example_pair"`` (a second sentence; null unless it
    reads pairs).

POST /v1/translate  (families that can translate)
    ``{"sentences": ["A dog runs."] (required, 1..64), "beam": <config's>, "len_penalty": <config's>,
    "n_best": 1 (<= beam), "attention": false, "stream": false}``
    -> ``{"model": "...", "translations": ["Ein Hund rennt."], "scores": [-1.23],
    "hypotheses": [[{"text": "...", "score": -1.23}, ...]],   # only when n_best > 1: n_best per sentence
    "attention": [{"source": ["▁A", "▁dog", ..., "</s>"], "target": ["▁Ein", ..., "</s>"],
    "weights": [[...source floats...] per target token]}]}``   # only when "attention": cross-attention of
    the best hypothesis averaged over layers and heads, one row per output step (EOS included)
    Scores are beam search's (sum of log-probabilities / (length + 1) ** len_penalty); greedy: the sum.
    Requests with the same model, beam, len_penalty, n_best and attention share batches; the outputs equal
    ``attnkit translate``'s (offline) decoding of the same sentences.
    Stream ``step`` events, one per sentence and step: ``{"sentence": 0, "step": 3, "token": "▁rennt",
    "tokens": ["▁Ein", "▁Hund", "▁rennt"], "text": "Ein Hund rennt", "score": -2.1, "done": false,
    "beams": [{"tokens": [...], "text": "...", "score": -2.1}, ...],    # beam > 1: the live beams, best first
    "attention": [...source floats...]}``   # when "attention": the step's cross-attention row (of the best)
    The current best hypothesis is the best live beam; the event with ``"done": true`` carries the sentence's
    final best hypothesis (its ``score`` as in the answer).

POST /v1/generate  (language models)
    ``{"prompt": "", "max_tokens": 100 (0..1024), "temperature": 1.0 (0: greedy), "top_k": 0 (0: all),
    "top_p": 1.0 (in (0, 1]), "seed": null, "stream": false, "attention": false, "top": 0 (0..50)}``
    -> ``{"model": "...", "text": "<prompt as read><continuation>", "completion": "<continuation>",
    "tokens": ["new", "pieces"], "score": <sum of log p of the new tokens, EOS included if it ended>,
    "steps": [{"token": "x", "top": [["x", 0.61, 0.75], ...]}]}``   # steps only when "top" > 0: per new token
    the ``top`` most likely next tokens as [piece, model probability, probability it was sampled with (after
    temperature, top-k, top-p)], from one teacher-forced pass over the result.
    Stream ``step`` events: ``{"step": 0, "token": "x", "text": "x",    # text: what the token adds
    "attention": [...floats over the positions so far: BOS, prompt, new tokens...],  # when "attention"
    "top": [[piece, p, q], ...]}``   # when "top" > 0 and sampling (temperature > 0)
    Attention rows and ``top`` come with prompts that fit the model's positions together with max_tokens
    (else the text streams without them).

POST /v1/caption  (captioners; multipart/form-data)
    fields ``image`` (file, required; at most 10 MiB), ``model`` (empty: as absent), ``beam`` (config's),
    ``attention`` (true)
    -> ``{"model": "...", "caption": "a dog runs", "words": ["a", "dog", "runs", "<end>"], "score": -3.2,
    "grid": [7, 7], "attention": [[...grid floats, row-major...] per word]}``  # attention: where each word looked
    Requests with the same model, beam and attention share batches.

POST /v1/attention  (families with attention; one example)
    ``{"source": "A dog runs." (a sentence; a language model's text), "image": null (captioners: the image file's
    bytes as base64, and no source), "target": null (null: the model's own output, decoded under the
    interventions), "mask_heads": [["cross", 0, 3], ...] (kind "encoder" | "decoder" | "cross", layer, head),
    "mask_source": [1, 4] (positions in "source" below, EOS included; a captioner's grid cells), "precision": 4}``
    -> ``{"model": "...", "family": "transformer", "source": ["▁A", ..., "</s>"], "target": ["<s>", "▁Ein", ...],
    "output": "Ein Hund rennt.", "score": -1.9,       # log p(output | source) under the interventions
    "encoder": [[[[...]]]],    # [layer][head][query][key]: source over source
    "decoder": [[[[...]]]],    # [layer][head][query][key]: target over target (a language model's only one)
    "cross": [[[[...]]]],      # [layer][head][target][source]; RNNsearch and Show-Attend-Tell: 1 layer, 1 head
    "grid": null,              # captioners: [height, width]
    "masked": {"heads": [["cross", 0, 3]], "source": [1, 4]}}``
    Row t of decoder and cross is the attention while predicting target[t + 1] (the last row predicts EOS).
    A head is masked by zeroing its slice of the input of that attention's output projection; a source token
    by making it padding (a Transformer's ids become PAD, hidden from its encoder too; RNNsearch and the
    Transformer captioner: hidden from the decoder's attention; Show-Attend-Tell and language models: 422).

POST /v1/classify  (classifiers and regressors: fine-tuned BERT; the only endpoint they answer)
    ``{"sentences": ["A gripping film."] (required, 1..64), "pairs": null (a model fine-tuned on pairs: required,
    one second sentence per sentence; else null), "explain": false (true: one sentence only)}``
    -> ``{"model": "...", "results": [{"label": "1", "probabilities": {"0": 0.1, "1": 0.9}, "score": null}],
    # a regressor: {"label": "score", "probabilities": null, "score": 3.7}
    "explanation": {"pieces": ["[CLS]", "a", ..., "[SEP]"], "token_types": [0, ...], "label": "1",
    "value": 0.9,            # the predicted label's probability (a regressor's score)
    "occlusion": [...],      # per piece: how much hiding it lowers the label's log-odds (a regressor's score)
                             # (0 at [CLS] and [SEP])
    "attention": [[[[...]]]],  # [layer][head][query][key], 4 decimals
    "rollout": [[...]]}}``   # [query][piece]: attention rollout, rows summing to 1
    ``explanation`` only with ``"explain": true`` (:func:`attnkit.decode.explain`). An input (a pair: both
    sentences together) may have as many word pieces as the model reads, [CLS] and [SEP] not counted, and at most
    the server's ``--max-source-tokens``; more is 413 (the model would cut it). The results equal ``attnkit
    classify``'s (:func:`attnkit.decode.classify`) on the same inputs; requests to one model share batches.

POST /v1/score
    ``{"sources": ["A dog runs."] (omit for a language model), "targets": ["Ein Hund rennt."] (required)}``
    -> ``{"model": "...", "scores": [-1.9]}``   # log p(target | source): the sum over its tokens and EOS

POST /v1/positional  (Transformer families)
    ``{"positions": 50 (1..2048, at most the model's max_positions), "side": "source" | "target"}``
    -> ``{"model": "...", "kind": "sinusoidal", "d_model": 512, "matrix": [[...d_model floats...] per position],
    "dot": [[...positions floats...] per position]}``   # dot: the dot products between positions

POST /v1/transcribe  (speech models; multipart/form-data)
    fields ``audio`` (file, required; WAV, FLAC or OGG, at most 5 MiB and 30 s), ``model``, ``beam`` (config's),
    ``attention`` (true), ``stream`` (false)
    -> ``{"model": "...", "transcript": "4 0 7", "characters": ["4", " ", "0", ..., "<end>"], "score": -1.2,
    "frames": [[0.0, 0.08], ...],   # each encoder frame's start and end in seconds
    "seconds": 2.1, "spectrogram": [[...n_mels floats...] per 10 ms frame],
    "attention": [[...frame floats...] per character]}``   # where each character listened
    Requests with the same model, beam and attention share batches. Stream ``step`` events as translate's (one
    utterance: ``"sentence": 0``): the partial transcript (``tokens``, ``text``), its score, and the step's attention
    over the encoder frames; ``done`` carries the answer.

POST /v1/answer  (visual question answering; multipart/form-data)
    fields ``image`` (file, required; at most 10 MiB), ``question`` (required, not empty), ``model``
    -> ``{"model": "...", "question": "what color is the shape?", "answer": "red", "probability": 0.99,
    "probabilities": {"black": 0.0, ...}, "glimpses": [[[...grid floats...] per row] per glimpse],
    "unknown_words": ["colour"],   # words the model never saw, read as <unk>
    "grid": [8, 8]}``   # glimpses: null for the question-only baseline. Requests to one model share batches.

GET /metrics
    Prometheus text: ``attnkit_requests_total{endpoint,status}``, ``attnkit_request_seconds`` (histogram per
    endpoint), ``attnkit_batch_sentences`` and ``attnkit_batch_seconds`` (histograms), ``attnkit_queue_depth``,
    ``attnkit_in_flight``, ``attnkit_batches_total``, ``process_resident_memory_bytes``.

GET /docs, /openapi.json
    The OpenAPI page (served offline when swagger-ui-bundle is installed).

GET /  (and every other path)
    The attention explorer's static files (``attnkit/serve/static/``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from attnkit.errors import AttnkitError
from attnkit.serve import compute
from attnkit.serve.errors import ApiError, validation_message
from attnkit.serve.metrics import Metrics
from attnkit.serve.middleware import ENDPOINTS, GuardMiddleware
from attnkit.serve.openapi import openapi_document
from attnkit.serve.schemas import (
    AttentionRequest,
    ClassifyRequest,
    GenerateRequest,
    PositionalRequest,
    ScoreRequest,
    TranslateRequest,
)
from attnkit.serve.settings import ServedModel, Settings
from attnkit.serve.worker import Job, Worker

log = logging.getLogger("attnkit.serve")

STATIC = Path(__file__).parent / "static"


def _json(data, status: int = 200, headers: dict | None = None) -> Response:
    """JSON without spaces (attention tensors are large)."""
    body = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def error_response(status: int, message: str, headers: dict | None = None) -> Response:
    return _json({"error": " ".join(str(message).split())}, status, headers)


def create_app(models: dict, settings: Settings | None = None) -> FastAPI:
    """The FastAPI app serving ``models`` ({name: :class:`attnkit.api.Model`}, the first the default).

    Starting the app starts its inference worker thread; stopping it stops the thread."""
    settings = settings or Settings()
    if not models:
        raise AttnkitError("serve: no model to serve")
    served = {name: ServedModel(name, model) for name, model in models.items()}
    default = next(iter(served))
    uploads = compute.uploads()
    metrics = Metrics()
    worker = Worker(settings, metrics)
    started = time.monotonic()

    async def lifespan(app):
        worker.start()
        try:
            yield
        finally:
            worker.stop()

    app = FastAPI(title="attnkit serve", version=_version(), lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Trained attnkit models over HTTP; the attention explorer at /. "
                              "Contract: the docstring of attnkit.serve.app.")
    app.state.settings, app.state.worker, app.state.metrics, app.state.models = settings, worker, metrics, served
    app.state.endpoints = ENDPOINTS | set(uploads)
    app.add_middleware(GuardMiddleware, settings=settings, metrics=metrics, endpoints=app.state.endpoints,
                       limits={path: upload.body_bytes(settings) for path, upload in uploads.items()})

    # --- errors: one line of JSON, never a traceback

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        status, message = validation_message(exc.errors())
        content_type = request.headers.get("content-type", "")
        if message.startswith("body: expected a JSON object") and "json" not in content_type:
            message += f" (sent as {content_type or 'no content type'}: send Content-Type: application/json)"
        return error_response(status, message)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return error_response(exc.status, exc.message, exc.headers)

    @app.exception_handler(AttnkitError)
    async def attnkit_error(request: Request, exc: AttnkitError):
        return error_response(getattr(exc, "status", 422), str(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        if exc.status_code in (408, 413):
            message = str(exc.detail)
        elif exc.status_code == 404:
            message = f"path: no such endpoint {request.url.path}"
        elif exc.status_code == 405:
            message = f"method: {request.method} is not allowed on {request.url.path}"
            return error_response(405, message, {"Allow": allowed_methods(request.app, request.url.path)})
        elif exc.status_code == 400:  # FastAPI's own: a body it could not decode (not UTF-8)
            detail = str(exc.detail)
            message = f"body: {detail[:1].lower()}{detail[1:]} (expected UTF-8 JSON)"
        else:
            message = f"request: {exc.detail}"
        return error_response(exc.status_code, message, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception):
        log.exception("internal error on %s %s", request.method, request.url.path)
        return error_response(500, "internal: the server failed on this request (see its log)")

    # --- helpers

    def pick(name: str | None, endpoint: str) -> ServedModel:
        """The model a request to ``endpoint`` names, or the one it gets by default (:func:`compute.default_for`);
        404 for an unknown name, 422 for a model that does not answer ``endpoint``."""
        m = served.get((compute.default_for(served, default, endpoint) or default) if name is None else name)
        if m is None:
            raise ApiError(404, f"model: no model named {name!r} (serving: {', '.join(served)})")
        capability = compute.endpoints()[endpoint]
        if capability not in m.model.capabilities:
            can = ", ".join(sorted(m.model.capabilities)) or "nothing"
            raise ApiError(422, f"model: {m.name} is a {m.model.family} model, which cannot {capability} "
                                f"(it can: {can})")
        if "classify" in m.model.capabilities and endpoint != "/v1/classify":
            raise ApiError(422, f"model: {m.name} is a {m.model.family} model, which answers /v1/classify only "
                                "(its attention: explain there)")
        return m

    async def run(job: Job, request: Request) -> Response:
        """Queue ``job``, wait for its answer within the time limit or until its client leaves, free its slot."""
        worker.admit(job)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            worker.submit(job)
            done, _ = await asyncio.wait({job.future, gone}, timeout=max(job.deadline - time.monotonic(), 0.0),
                                         return_when=asyncio.FIRST_COMPLETED)
            if job.future in done:
                return _json(job.future.result())
            if gone in done:
                return error_response(499, "client: disconnected before the answer")  # nobody reads it
            raise ApiError(504, f"timeout: no answer within {settings.timeout:g} s (the server is busy)")
        finally:
            gone.cancel()
            worker.cancel(job)
            worker.release(job)

    def stream(job: Job) -> StreamingResponse:
        worker.admit(job)
        worker.submit(job)

        async def events():
            try:
                while True:
                    remaining = job.deadline - time.monotonic()
                    try:
                        name, data = await asyncio.wait_for(job.events.get(), max(remaining, 0.0))
                    except asyncio.TimeoutError:
                        yield _sse("error", {"error": f"timeout: not finished within {settings.timeout:g} s",
                                             "status": 504})
                        return
                    yield _sse(name, data)
                    if name in ("done", "error"):
                        return
            finally:
                worker.cancel(job)
                worker.release(job)

        def leave():
            worker.cancel(job)
            worker.release(job)

        return _Stream(events(), leave, media_type="text/event-stream",
                       headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def job(kind: str, m: ServedModel, payload, key=None, tokens: int = 0, streaming: bool = False) -> Job:
        return Job(kind, m, payload, key=key, tokens=tokens, deadline=time.monotonic() + settings.timeout,
                   streaming=streaming)

    # --- endpoints

    @app.get("/health")
    async def health():
        return {"status": "ok", "models": list(served), "queue": worker.depth(), "in_flight": worker.in_flight(),
                "uptime_s": round(time.monotonic() - started, 1)}

    @app.get("/v1/models")
    async def list_models():
        return {"models": [compute.describe(m, m.name == default) for m in served.values()]}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(queue_depth=worker.depth(), in_flight=worker.in_flight()),
                        media_type="text/plain; version=0.0.4")

    @app.post("/v1/translate")
    async def translate(body: TranslateRequest, request: Request):
        m = pick(body.model, "/v1/translate")
        options = compute.translate_options(m, body, settings)
        tokens = m.model.kind.count_tokens(m.model, body.sentences, settings)
        j = job("translate", m, body, key=("translate", m.name, *options), tokens=sum(tokens), streaming=body.stream)
        return stream(j) if body.stream else await run(j, request)

    @app.post("/v1/generate")
    async def generate(body: GenerateRequest, request: Request):
        m = pick(body.model, "/v1/generate")
        if body.max_tokens > settings.max_new_tokens:
            raise ApiError(413, f"max_tokens: {body.max_tokens} is more than this server's limit of "
                                f"{settings.max_new_tokens}")
        m.model.kind.count_tokens(m.model, [body.prompt], settings, "prompt")
        j = job("generate", m, body, streaming=body.stream)
        return stream(j) if body.stream else await run(j, request)

    def upload_endpoint(upload):
        """The handler of an input kind's upload endpoint (:class:`attnkit.kinds.upload.Upload`): the form read and
        checked field by field as the kind declares it, the payload made by the kind, then queued (batched with
        requests whose key fields agree) and answered, or streamed where the form asks it."""

        async def handler(request: Request):
            form = await _form(request, upload, settings)
            name = form.get("model") or None
            if name is not None and not isinstance(name, str):
                raise ApiError(422, "model: expected a text field (a served model's name), not a file")
            m = pick(name, upload.path)
            values = await _read_fields(form, upload, settings)
            payload = m.model.kind.read_form(m.model, values, settings)
            key = (upload.path, m.name, *(values[f.name] for f in upload.fields if f.key)) if upload.batched else None
            j = job("upload", m, payload, key=key, tokens=m.model.kind.upload_tokens(m.model, payload),
                    streaming=values.get("stream", False))
            return stream(j) if j.streaming else await run(j, request)

        handler.__name__ = upload.summary.lower()
        return handler

    for upload in uploads.values():
        app.add_api_route(upload.path, upload_endpoint(upload), methods=["POST"])

    @app.post("/v1/attention")
    async def attention(body: AttentionRequest, request: Request):
        m = pick(body.model, "/v1/attention")
        value = m.model.kind.read_request(m.model, body, settings, m.name)
        return await run(job("attention", m, {"request": body, "input": value}), request)

    @app.post("/v1/score")
    async def score(body: ScoreRequest, request: Request):
        m = pick(body.model, "/v1/score")
        m.model.kind.check_score(m.model, body.sources, body.targets, settings, m.name)
        if len(body.targets) > settings.max_sentences:
            raise ApiError(413, f"targets: {len(body.targets)} texts, more than this server's limit of "
                                f"{settings.max_sentences}")
        return await run(job("score", m, body), request)

    @app.post("/v1/classify")
    async def classify(body: ClassifyRequest, request: Request):
        m = pick(body.model, "/v1/classify")
        compute.check_classify(m, body)
        tokens = compute.classify_tokens(m, body.sentences, body.pairs, settings)
        key = None if body.explain else ("classify", m.name)
        return await run(job("classify", m, body, key=key, tokens=sum(tokens)), request)

    @app.post("/v1/positional")
    async def positional(body: PositionalRequest, request: Request):
        m = pick(body.model, "/v1/positional")
        return await run(job("positional", m, body), request)

    # --- the OpenAPI page, offline when swagger-ui-bundle is installed

    _docs(app)
    document = openapi_document(served, default, settings, app.version)
    app.openapi = lambda: document

    # --- the explorer

    if STATIC.is_dir():
        from fastapi.staticfiles import StaticFiles

        app.mount("/", _Explorer(StaticFiles(directory=STATIC, html=True)), name="static")
    else:
        @app.get("/", include_in_schema=False)
        async def index():
            return HTMLResponse("<!doctype html><title>attnkit serve</title><p>attnkit serve: the API is "
                                "documented at <a href='/docs'>/docs</a>.</p>")
    return app


class _Stream(StreamingResponse):
    """A stream that frees its request's slot however it ends: finished, failed, or its client gone before the
    first event (a generator never started never runs its ``finally``)."""

    def __init__(self, content, leave, **kwargs):
        super().__init__(content, **kwargs)
        self.leave = leave

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.leave()


class _Explorer:
    """The explorer's files at ``/``, which would otherwise answer a known endpoint asked with the wrong method
    (the mount matches every path the API's routes did not): those get 405."""

    def __init__(self, files):
        self.files = files

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        endpoints = scope["app"].state.endpoints
        if scope["type"] == "http" and (path in endpoints or path.startswith("/v1/")):
            if path not in endpoints:
                return await error_response(404, f"path: no such endpoint {path}")(scope, receive, send)
            return await error_response(405, f"method: {scope.get('method')} is not allowed on {path}",
                                        {"Allow": allowed_methods(scope["app"], path)})(scope, receive, send)
        return await self.files(scope, receive, send)


def allowed_methods(app, path: str) -> str:
    """The ``Allow`` header of a 405 (RFC 9110): the methods the app's routes take on ``path``."""
    methods = set()
    for route in app.routes:
        if getattr(route, "path", None) == path:
            methods |= set(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


async def _disconnected(request: Request) -> None:
    """Returns when the client of ``request`` (whose body has been read) disconnects."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _sse(name: str, data) -> str:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'), ensure_ascii=False)}\n\n"


async def _form(request: Request, upload, settings: Settings):
    """The multipart form of a request to ``upload``'s path: 400 for a body that is not one."""
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        raise ApiError(400, f"body: expected multipart/form-data with a file field named {upload.files[0].name}")
    try:
        return await request.form(max_files=len(upload.files), max_fields=max(8, len(upload.form_fields) + 2),
                                  max_part_size=upload.max_bytes(settings))
    except (ApiError, StarletteHTTPException):
        raise
    except Exception as e:  # noqa: BLE001 - python-multipart and starlette raise several kinds for a bad body
        detail = getattr(e, "detail", None) or str(e) or type(e).__name__
        raise ApiError(400, f"body: malformed multipart form ({detail})") from None


async def _read_fields(form, upload, settings: Settings) -> dict:
    """{name: value} of every field ``upload`` declares (and ``stream`` where it streams), each of its type and
    within its limits, in the order declared: a file's bytes (required, not empty, at most its size limit), an
    integer in its range, a boolean, a text; 422 naming the field otherwise, and for a field it does not declare."""
    fields = upload.form_fields
    values = {}
    for f in fields:
        value = form.get(f.name)
        if f.type == "file":
            if value is None or isinstance(value, str):
                raise ApiError(422, f"{f.name}: required (a multipart file field named {f.name})")
            data = await value.read()
            if not data:
                raise ApiError(422, f"{f.name}: the file is empty")
            if len(data) > f.limit(settings):
                raise ApiError(413, f"{f.name}: {len(data)} bytes, more than this server's limit of "
                                    f"{f.limit(settings)}")
            values[f.name] = data
        else:
            values[f.name] = f.read(value, settings)
    extra = sorted(set(form.keys()) - {f.name for f in fields} - {"model"})
    if extra:
        names = ", ".join([*(f.name for f in fields), "model"])
        raise ApiError(422, f"{extra[0]}: unknown field (fields: {names})")
    return values


def _docs(app: FastAPI) -> None:
    from fastapi.openapi.docs import get_swagger_ui_html

    try:
        import swagger_ui_bundle

        assets = Path(swagger_ui_bundle.swagger_ui_path)
    except ImportError:  # the CDN's copy, as FastAPI's default page
        assets = None
    if assets is not None:
        from fastapi.staticfiles import StaticFiles

        app.mount("/docs-assets", StaticFiles(directory=assets), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs():
        if assets is None:
            return get_swagger_ui_html(openapi_url="/openapi.json", title="attnkit serve")
        return get_swagger_ui_html(openapi_url="/openapi.json", title="attnkit serve",
                                   swagger_js_url="/docs-assets/swagger-ui-bundle.js",
                                   swagger_css_url="/docs-assets/swagger-ui.css",
                                   swagger_favicon_url="/docs-assets/favicon-32x32.png")


def _version() -> str:
    from attnkit import __version__

    return __version__


__all__ = ["create_app", "error_response"]
