"""The OpenAPI document of one running server: what it answers, for the models it serves, with its limits.

FastAPI's own document is derived from the request classes alone, so it cannot know that ``/v1/generate`` needs a
language model, that a captioner's attention needs an image, how many layers a model has or what this server's
limits are. This document is written from the served models and :class:`~attnkit.serve.Settings` instead:

* Each request body is, per model that answers the endpoint, one object schema (``oneOf`` them when there are
  several), its ``model`` field naming that model (optional for the model a request naming none gets); its
  ranges are this server's (``maxItems``, ``maximum``) and that model's (heads to mask, learned positions).
* Every status the endpoint can answer is declared, each error with the one-line ``Error`` schema; 200 with the
  answer's schema (and ``text/event-stream`` where ``"stream": true`` is allowed).
* What JSON Schema cannot say is in the descriptions and in ``x-`` keys a client can read: a text's token limit
  (``x-max-tokens``, counted by the model's own tokenizer), and relations between fields (``x-rules``). Requests
  that break them are answered with the status named there.
"""

from __future__ import annotations

from attnkit import registry
from attnkit.kinds.schema import BOOLEAN, INTEGER, NUMBER, STRING
from attnkit.kinds.schema import array as _array
from attnkit.kinds.schema import nullable as _nullable
from attnkit.kinds.schema import obj as _obj
from attnkit.kinds.schema import text as _text
from attnkit.kinds.text import learned_positions
from attnkit.serve.compute import (
    classify_token_limit,
    default_for,
    positional_encoding,
    reads_pairs,
    serves,
    uploads,
)
from attnkit.serve.settings import Settings

ERROR = {"$ref": "#/components/schemas/Error"}

STATUS_TEXT = {
    400: "malformed body: not JSON, not an object, not UTF-8, an unreadable form or Content-Length",
    401: "missing or wrong API key",
    404: "no model of that name",
    408: "the body did not arrive whole within the server's body timeout",
    413: "too large: body bytes, texts per request, tokens per text, image bytes or pixels",
    422: "a field of the wrong type or value, an unknown field, or a model that cannot do what was asked",
    429: "the queue is full (see Retry-After)",
    500: "an internal error (logged by the server)",
    504: "no answer within the server's time limit",
}
GET_ERRORS = (400, 408, 413, 500)  # the guard in front of every path reads headers and bodies on GETs too
POST_ERRORS = (400, 404, 408, 413, 422, 429, 500, 504)


# --- what the models can take


def _heads(model) -> dict:
    """{kind: (layers, heads)} of the model's multi-head attentions (the ones ``mask_heads`` can silence)."""
    return {kind: (len(layers), layers[0].n_heads) for kind, layers in model.attention_modules().items() if layers}


def _mask_heads(model) -> dict:
    kinds = _heads(model)
    if not kinds:
        return _array({}, maxItems=0, description=f"a {model.family} model has no multi-head attention to mask")
    entries = [{"type": "array", "prefixItems": [{"const": kind}, {"type": "integer", "minimum": 0,
                                                                      "maximum": layers - 1},
                                                  {"type": "integer", "minimum": 0, "maximum": heads - 1}],
                "minItems": 3, "maxItems": 3} for kind, (layers, heads) in kinds.items()]
    return _array(entries[0] if len(entries) == 1 else {"oneOf": entries},
                  description="[[kind, layer, head], ...]: " + ", ".join(
                      f'"{k}": {n} layers x {h} heads' for k, (n, h) in kinds.items()) + " (from 0)")


def _mask_source(model) -> dict:
    if not model.can_mask_source:
        return _array(INTEGER, maxItems=0, description=f"a {model.family} model cannot hide source tokens")
    grid = model.kind.describe(model).get("grid")
    if grid:
        h, w = grid
        return _array({"type": "integer", "minimum": 0, "maximum": h * w - 1},
                      description=f"grid cells to hide (row-major, {h} x {w})")
    return _array({"type": "integer", "minimum": 0}, description="source positions to hide, EOS included",
                  **{"x-rules": ["each position < the source's tokens, EOS included (else 422)"]})


def _positional_sides(model) -> list[str]:
    return [side for side in ("source", "target") if positional_encoding(model, side) is not None]


# --- request bodies, one branch per model


def _branch(m, default: str, properties: dict, required=(), **more) -> dict:
    """The body for model ``m``; ``default``: the model a body naming none gets at this endpoint."""
    names = [m.name, None] if m.name == default else [m.name]
    model = {"type": ["string", "null"] if m.name == default else "string", "enum": names,
             "description": "a name from GET /v1/models" + (" (the default here)" if m.name == default else "")}
    if m.name != default:
        required = [*required, "model"]
    return _obj({"model": model, **properties}, required, title=f"{m.name} ({m.model.family})", **more)


def _one_of(branches: list[dict]) -> dict:
    return branches[0] if len(branches) == 1 else {"oneOf": branches}


def _translate(m, default: str, s: Settings) -> dict:
    beam = m.model.config.decode.beam_size
    return _branch(m, default, {
        "sentences": _array(_text("a source sentence", m.model.kind.token_limit(m.model, s)), minItems=1,
                            maxItems=s.max_sentences),
        "beam": _nullable({"type": "integer", "minimum": 1, "maximum": s.max_beam,
                           "description": f"1 is greedy (default: the checkpoint's, {beam})"}),
        "len_penalty": _nullable({"type": "number", "minimum": 0, "maximum": 10}),
        "n_best": {"type": "integer", "minimum": 1, "maximum": s.max_beam, "default": 1,
                   "description": "hypotheses per sentence, at most the beam"},
        "attention": {**BOOLEAN, "default": False}, "stream": {**BOOLEAN, "default": False},
    }, ["sentences"], **{"x-rules": [f"n_best <= beam (the default beam is {beam}; else 422)"]})


def _generate(m, default: str, s: Settings) -> dict:
    return _branch(m, default, {
        "prompt": {**_text("the text to continue", m.model.kind.token_limit(m.model, s)), "default": ""},
        "max_tokens": {"type": "integer", "minimum": 0, "maximum": s.max_new_tokens, "default": 100},
        "temperature": {"type": "number", "minimum": 0, "maximum": 100, "default": 1.0, "description": "0: greedy"},
        "top_k": {"type": "integer", "minimum": 0, "default": 0, "description": "0: all tokens"},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 1.0},
        "seed": _nullable({"type": "integer", "minimum": 0, "maximum": 2**63 - 1}),
        "stream": {**BOOLEAN, "default": False}, "attention": {**BOOLEAN, "default": False},
        "top": {"type": "integer", "minimum": 0, "maximum": 50, "default": 0},
    })


def _attention(m, default: str, s: Settings) -> dict:
    model = m.model
    properties, required = model.kind.attention_schema(model, s)
    return _branch(m, default, {**properties, "mask_heads": _mask_heads(model), "mask_source": _mask_source(model),
                                "precision": {"type": "integer", "minimum": 1, "maximum": 8, "default": 4}},
                   required)


def _score(m, default: str, s: Settings) -> dict:
    properties, required, more = m.model.kind.score_schema(m.model, s)
    return _branch(m, default, properties, required, **more)


def _positional(m, default: str, s: Settings) -> dict:
    learned = learned_positions(m.model)
    sides = _positional_sides(m.model)
    return _branch(m, default, {
        "positions": {"type": "integer", "minimum": 1, "maximum": min(2048, learned or 2048), "default": 50},
        "side": {"enum": sides, "default": "source"} if "source" in sides else {"enum": sides}},
        [] if "source" in sides else ["side"])


def _classify(m, default: str, s: Settings) -> dict:
    limit = classify_token_limit(m, s)

    def text(description: str) -> dict:
        return {"type": "string", "pattern": r"\S", "x-max-tokens": limit, "description": (
            f"{description}, not blank (else 422); at most {limit} word pieces, [CLS] and [SEP] not counted "
            "(more: 413)")}

    sentences = _array(text("a sentence" if not reads_pairs(m.model) else "a pair's first sentence"), minItems=1,
                       maxItems=s.max_sentences)
    explain = {**BOOLEAN, "default": False,
               "description": "also the explanation: occlusion, attention, rollout (one sentence only)"}
    rules = ["explain is true with exactly one sentence (else 422)"]
    if reads_pairs(m.model):
        return _branch(m, default, {
            "sentences": sentences,
            "pairs": _array(text("the pair's second sentence"), minItems=1, maxItems=s.max_sentences),
            "explain": explain}, ["sentences", "pairs"], **{"x-rules": [
                "as many pairs as sentences (else 422)",
                f"sentences[i] and pairs[i] together at most {limit} word pieces (else 413)", *rules]})
    return _branch(m, default, {"sentences": sentences, "pairs": {"type": "null", "description": (
        f"{m.name} was fine-tuned on single sentences")}, "explain": explain}, ["sentences"],
        **{"x-rules": rules})


def _form(upload, names: list[str], first: str, settings: Settings) -> dict:
    """The multipart body of an upload endpoint (:class:`attnkit.kinds.upload.Upload`) whose models are ``names``,
    ``first`` the one a form naming none gets."""
    properties = {f.name: f.json_schema(settings) for f in upload.form_fields}
    properties["model"] = {"type": "string", "enum": [*names, ""],
                           "description": f"{upload.model} (empty or absent: {first})"}
    form = _obj(properties, [f.name for f in upload.fields if f.required])
    return {"required": True, "content": {"multipart/form-data": {
        "schema": form, "encoding": {f.name: {"contentType": f.media} for f in upload.files}}}}


BODIES = {"/v1/translate": _translate, "/v1/generate": _generate, "/v1/attention": _attention,
          "/v1/score": _score, "/v1/positional": _positional, "/v1/classify": _classify}


# --- answers


def _answers() -> dict:
    """The 200 answers' schemas (the contract in :mod:`attnkit.serve.app`'s docstring); what a model's entry of
    /v1/models says of its input kind, and an upload's answer, each kind's own."""
    described, decoding = {}, {}
    for kind in registry.kinds():
        entry, decode = kind.describe_schema()
        described.update(entry)
        decoding.update(decode)
    words = _array(STRING)
    matrix = _array(_array(NUMBER))
    maps = _array(_array(matrix))  # [layer][head][query][key]
    grid = _array(INTEGER, minItems=2, maxItems=2)
    return {
        "Error": _obj({"error": {"type": "string", "pattern": r"^[^\n]*$",
                                 "description": "one line: '<field>: <what is wrong>'"}}, ["error"]),
        "Health": _obj({"status": {"const": "ok"}, "models": words, "queue": {"type": "integer", "minimum": 0},
                        "in_flight": {"type": "integer", "minimum": 0}, "uptime_s": NUMBER},
                       ["status", "models", "queue", "in_flight", "uptime_s"]),
        "Models": _obj({"models": _array(_obj({
            "name": STRING, "family": STRING, "default": BOOLEAN, "capabilities": words, "path": STRING,
            "decode": _nullable(_obj({"beam": INTEGER, "len_penalty": NUMBER, "max_len_a": NUMBER,
                                      "max_len_b": NUMBER, **decoding},
                                     ["beam", "len_penalty", "max_len_a", "max_len_b"])),
            "attention": {"type": "object", "additionalProperties": _obj({"layers": INTEGER, "heads": INTEGER},
                                                                         ["layers", "heads"])},
            "grid": _nullable(grid), "positional": _nullable(STRING), "max_positions": _nullable(INTEGER),
            "example": _nullable(STRING), "example_pair": _nullable(STRING), "labels": words,
            "problem": {"enum": ["classification", "regression"]}, "pairs": BOOLEAN, **described},
            ["name", "family", "default", "capabilities", "path", "decode", "attention", "grid", "positional",
             "max_positions", "example"]))}, ["models"]),
        "Translation": _obj({
            "model": STRING, "translations": words, "scores": _array(NUMBER),
            "hypotheses": _array(_array(_obj({"text": STRING, "score": NUMBER}, ["text", "score"]))),
            "attention": _array(_obj({"source": words, "target": words, "weights": matrix},
                                     ["source", "target", "weights"]))}, ["model", "translations", "scores"]),
        "Generation": _obj({
            "model": STRING, "text": STRING, "completion": STRING, "tokens": words, "score": NUMBER,
            "steps": _array(_obj({"token": STRING, "top": _array(
                _array({"type": ["string", "number"]}, minItems=3, maxItems=3,
                       description="[piece, model probability, sampling probability]"))},
                ["token", "top"]))}, ["model", "text", "completion", "tokens", "score"]),
        "Attention": _obj({
            "model": STRING, "family": STRING, "source": words, "target": words, "output": STRING,
            "score": NUMBER, "encoder": maps, "decoder": maps, "cross": maps, "grid": _nullable(grid),
            "masked": _obj({"heads": _array(_array({"type": ["string", "integer"]}, minItems=3, maxItems=3,
                                                   description="[kind, layer, head]")), "source": _array(INTEGER)},
                           ["heads", "source"])},
            ["model", "family", "source", "target", "output", "score", "encoder", "decoder", "cross", "grid",
             "masked"]),
        "Scores": _obj({"model": STRING, "scores": _array(NUMBER)}, ["model", "scores"]),
        "Classification": _obj({
            "model": STRING,
            "results": _array(_obj({
                "label": STRING,
                "probabilities": _nullable({"type": "object", "additionalProperties": NUMBER,
                                            "description": "label -> probability (null for a regressor)"}),
                "score": _nullable({**NUMBER, "description": "a regressor's prediction (null for a classifier)"})},
                ["label", "probabilities", "score"]), description="one per sentence, in order"),
            "explanation": _obj({
                "pieces": words, "token_types": _array(INTEGER), "label": STRING,
                "value": {**NUMBER, "description": "the label's probability (a regressor's score)"},
                "occlusion": _array(NUMBER, description="per piece: how much hiding it lowers the label's log-odds (a "
                                                        "regressor's score)"),
                "attention": maps, "rollout": matrix},
                ["pieces", "token_types", "label", "value", "occlusion", "attention", "rollout"])},
            ["model", "results"]),
        "Positional": _obj({"model": STRING, "kind": _nullable(STRING), "d_model": INTEGER, "matrix": matrix,
                            "dot": matrix}, ["model", "kind", "d_model", "matrix", "dot"]),
        **{upload.answer: upload.answer_schema for upload in uploads().values()},
    }


def _responses(statuses, answer: str | None = None, streams: bool = False, text: bool = False,
               retry: bool = False) -> dict:
    ok = {"text/plain": {"schema": STRING}} if text else {"application/json": {"schema": {
        "$ref": f"#/components/schemas/{answer}"}}}
    if streams:
        ok["text/event-stream"] = {"schema": _obj({
            "event": {"enum": ["step", "done", "error"]},
            "data": {"type": "string", "contentMediaType": "application/json",
                     "description": "one line of JSON: a step; done: the answer as without stream; error: "
                                    '{"error": ..., "status": ...}'}}, ["event", "data"], closed=False,
            description="each event; step*, then done or error")}
    out = {"200": {"description": "the answer" + (" (text/event-stream when stream is true)" if streams else ""),
                   "content": ok}}
    for status in sorted(statuses):
        response = {"description": STATUS_TEXT[status], "content": {"application/json": {"schema": ERROR}}}
        if status == 429 and retry:
            response["headers"] = {"Retry-After": {"schema": INTEGER, "description": "seconds"}}
        if status == 401:
            response["headers"] = {"WWW-Authenticate": {"schema": STRING}}
        out[str(status)] = response
    return out


# --- the document


def openapi_document(served: dict, default: str, settings: Settings, version: str) -> dict:
    """The document ``GET /openapi.json`` answers: ``served`` {name: ServedModel}, ``default`` the default's name."""
    keyed = bool(settings.api_key)
    extra = (401,) if keyed else ()
    security = [{"bearer": []}, {"apiKey": []}] if keyed else None
    paths: dict = {}

    def operation(summary: str, responses: dict, body: dict | None = None, secured: bool = True) -> dict:
        op = {"summary": summary, "operationId": summary.lower().replace(" ", "_"), "responses": responses}
        if body is not None:
            op["requestBody"] = body
        if secured and security:
            op["security"] = security
        return op

    paths["/health"] = {"get": operation("Health", _responses(GET_ERRORS, "Health"), secured=False)}
    paths["/v1/models"] = {"get": operation("Models", _responses(GET_ERRORS + extra, "Models"))}
    paths["/metrics"] = {"get": operation("Metrics", _responses(GET_ERRORS + extra, text=True))}
    answers = {"/v1/translate": "Translation", "/v1/generate": "Generation", "/v1/attention": "Attention",
               "/v1/score": "Scores", "/v1/positional": "Positional", "/v1/classify": "Classification"}
    for path, build in BODIES.items():
        models = [m for m in served.values() if serves(m, path)]
        if not models:
            continue
        first = default_for(served, default, path)
        schema = _one_of([build(m, first, settings) for m in models])
        body = {"required": True, "content": {"application/json": {"schema": schema}}}
        streams = path in ("/v1/translate", "/v1/generate")
        paths[path] = {"post": operation(path.rsplit("/", 1)[1].capitalize(),
                                         _responses(POST_ERRORS + extra, answers[path], streams, retry=True), body)}
    for path, upload in uploads().items():
        names = [m.name for m in served.values() if serves(m, path)]
        if not names:
            continue
        body = _form(upload, names, default_for(served, default, path), settings)
        paths[path] = {"post": operation(upload.summary, _responses(POST_ERRORS + extra, upload.answer,
                                                                     upload.streams, retry=True), body)}
    document = {
        "openapi": "3.1.0",
        "info": {"title": "attnkit serve", "version": version,
                 "description": "Trained attnkit models over HTTP; the attention explorer at /. Errors are one line "
                                "of JSON naming the field. Contract: the docstring of attnkit.serve.app."},
        "paths": paths,
        "components": {"schemas": _answers()},
    }
    if keyed:
        document["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"}}
    return document
