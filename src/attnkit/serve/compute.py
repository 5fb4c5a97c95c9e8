"""What the worker thread computes for each endpoint, through :class:`attnkit.api.Model`, and the answers' JSON.

Checks that need the model but no decoding (sentence and prompt lengths, option ranges) run in the request's
handler (:func:`translate_options`, and the model's input kind: :mod:`attnkit.kinds`), so a bad request is answered
without waiting for the worker.

Translation batches run :meth:`attnkit.api.Model.translate` (:func:`attnkit.decode.translate`: the decoding
of ``attnkit translate``); a batch with a streaming request passes it an ``on_step`` callback
(:class:`attnkit.decode.search.SearchStep`) that sends each step's best hypotheses.

Classification batches run :func:`attnkit.decode.classify` on the model's module and tokenizer (what ``attnkit
classify`` runs), the sentences of every request of the batch together; an explanation runs
:func:`attnkit.decode.explain` for its one sentence.

Uploads (an image to caption or ask about, audio to transcribe: an input kind's
:class:`~attnkit.kinds.upload.Upload`) are answered by the model's input kind
(:meth:`~attnkit.kinds.InputKind.answer_uploads`), a batch at a time; a batch with a streaming request passes it the
same ``on_step`` as translation's.
"""

from __future__ import annotations

import torch

from attnkit import registry
from attnkit.errors import AttnkitError
from attnkit.kinds.schema import finite as _score
from attnkit.kinds.schema import rounded as _rounded
from attnkit.kinds.text import learned_positions
from attnkit.serve.errors import ApiError
from attnkit.serve.worker import Abandoned, Job
from attnkit.tokens import BOS, EOS

# --- checks in the handler


def translate_options(m, body, settings) -> tuple:
    """The decoding options of a translate request, defaults resolved: (beam, len_penalty, n_best, attention)."""
    d = m.model.config.decode
    beam = body.beam or d.beam_size
    if beam > settings.max_beam:
        raise ApiError(422, f"beam: {beam} is more than this server's limit of {settings.max_beam}")
    if body.n_best > beam:
        raise ApiError(422, f"n_best: {body.n_best} is more than the beam ({beam})")
    if len(body.sentences) > settings.max_sentences:
        raise ApiError(413, f"sentences: {len(body.sentences)} sentences, more than this server's limit of "
                            f"{settings.max_sentences} per request")
    penalty = d.len_penalty if body.len_penalty is None else body.len_penalty
    return beam, float(penalty), body.n_best, body.attention


# --- classifiers

def reads_pairs(model) -> bool:
    """Whether a classifier was fine-tuned on sentence pairs (and so classifies pairs, never single sentences)."""
    return model.takes_pairs


def classify_token_limit(m, settings) -> int:
    """Word pieces an input may have, [CLS] and [SEP] not counted (a pair: both sentences together): the model's
    length (its tokenizer's ``max_len`` and its learned positions, less the [CLS] and [SEP] of an input) and the
    server's ``max_source_tokens``, whichever is less. The model would cut a longer input; the server refuses it."""
    window = min(m.model.tokenizers.max_len, m.model.module.body.cfg.max_positions)
    return min(settings.max_source_tokens, window - (3 if reads_pairs(m.model) else 2))


def classify_tokens(m, sentences: list[str], pairs: list[str] | None, settings) -> list[int]:
    """Each input's tokens as the model reads them ([CLS] and [SEP] included: the batch budget); 413 past
    :func:`classify_token_limit`."""
    if len(sentences) > settings.max_sentences:
        raise ApiError(413, f"sentences: {len(sentences)} sentences, more than this server's limit of "
                            f"{settings.max_sentences} per request")
    tok, limit = m.model.tokenizers, classify_token_limit(m, settings)
    counts = []
    for i, text in enumerate(sentences):
        n = len(tok.ids(text))
        if pairs is not None:
            n += len(tok.ids(pairs[i]))
        if n > limit:
            what = f"sentences[{i}]: {n} word pieces" + (f" with pairs[{i}]" if pairs is not None else "")
            raise ApiError(413, f"{what}, more than {m.name}'s limit of {limit} ([CLS] and [SEP] not counted)")
        counts.append(n + (3 if pairs is not None else 2))
    return counts


def check_classify(m, body) -> None:
    """What a classify request's fields must be beyond their types (422 otherwise): no blank text (as
    :meth:`attnkit.api.Model.classify`: nothing to classify), pairs exactly for a model fine-tuned on pairs, one
    per sentence, an explanation for one sentence."""
    for field, texts in (("sentences", body.sentences), ("pairs", body.pairs or ())):
        for i, text in enumerate(texts):
            if not text.strip():
                raise ApiError(422, f"{field}[{i}]: blank, not a sentence")
    if reads_pairs(m.model):
        if body.pairs is None:
            raise ApiError(422, f"pairs: required: {m.name} was fine-tuned on sentence pairs (send one second "
                                "sentence per sentence)")
        if len(body.pairs) != len(body.sentences):
            raise ApiError(422, f"pairs: {len(body.pairs)} second sentences for {len(body.sentences)} sentences")
    elif body.pairs is not None:
        raise ApiError(422, f"pairs: {m.name} was fine-tuned on single sentences: send sentences alone")
    if body.explain and len(body.sentences) != 1:
        raise ApiError(422, f"explain: explains one sentence at a time, not {len(body.sentences)}")


# --- which model answers which endpoint

# the endpoints with JSON bodies, and the capability a model needs to answer each
CAPABILITY = {"/v1/translate": "translate", "/v1/generate": "generate", "/v1/attention": "attention",
              "/v1/score": "score", "/v1/positional": "attention", "/v1/classify": "classify"}


def uploads() -> dict:
    """{path: :class:`~attnkit.kinds.upload.Upload`}: the upload endpoint of every registered input kind that has
    one."""
    return {kind.upload.path: kind.upload for kind in registry.kinds() if kind.upload is not None}


def endpoints() -> dict[str, str]:
    """{path: the capability a model needs to answer it}: every POST endpoint, those with JSON bodies and the
    uploads."""
    return {**CAPABILITY, **{path: upload.capability for path, upload in uploads().items()}}


def serves(m, endpoint: str) -> bool:
    """Whether the served model ``m`` answers ``endpoint`` (the capability it needs, and what it reads). A
    classifier answers /v1/classify alone: its attention comes with an explanation there. An upload endpoint is
    answered by the models whose input kind declares it."""
    model = m.model
    if endpoints()[endpoint] not in model.capabilities:
        return False
    if "classify" in model.capabilities:
        return endpoint == "/v1/classify"
    if endpoint not in CAPABILITY:
        return model.kind.upload is not None and model.kind.upload.path == endpoint
    if endpoint in ("/v1/attention", "/v1/score") and not model.kind.json_inputs:
        return False
    if endpoint == "/v1/score":
        return model.kind.json_scores
    if endpoint == "/v1/positional":
        return any(positional_encoding(model, side) is not None for side in ("source", "target"))
    return True


def default_for(served: dict, default: str, endpoint: str) -> str | None:
    """The model a request to ``endpoint`` naming none gets: the server's default where it answers the endpoint,
    else the first served model that does (None: no served model does)."""
    if serves(served[default], endpoint):
        return default
    return next((name for name, m in served.items() if serves(m, endpoint)), None)


# --- the models' description


def describe(m, default: bool) -> dict:
    if m.info:
        return {**m.info, "default": default}
    model = m.model
    if "classify" in model.capabilities:
        m.info = _describe_classifier(m)
        return {**m.info, "default": default}
    if not model.generative:  # it decodes nothing: what it reads and answers is its input kind's to say
        m.info = {"name": m.name, "family": model.family, "capabilities": sorted(model.capabilities),
                  "path": str(model.path), "decode": None, "attention": {}, "positional": None,
                  "max_positions": None, **model.kind.describe(model), "example": model.kind.example(model)}
        return {**m.info, "default": default}
    d = model.config.decode
    counts = {}
    for kind, layers in model.attention_modules().items():
        counts[kind] = {"layers": len(layers), "heads": layers[0].n_heads if layers else 0}
    if registry.family(model.family).alignment:
        counts["cross"] = {"layers": 1, "heads": 1}
    kind = model.kind
    cfg = getattr(model.module, "cfg", None)
    positional = getattr(cfg, "positional", None) if positional_encoding(model, "target") is not None else None
    decode = {"beam": d.beam_size, "len_penalty": d.len_penalty, "max_len_a": d.max_len_a, "max_len_b": d.max_len_b,
              **kind.decode_settings(model)}
    m.info = {"name": m.name, "family": model.family, "capabilities": sorted(model.capabilities),
              "path": str(model.path), "decode": decode, "attention": counts, **kind.describe(model),
              "positional": positional, "max_positions": getattr(cfg, "max_positions", None),
              "example": kind.example(model)}
    return {**m.info, "default": default}


def _describe_classifier(m) -> dict:
    """A classifier's description: its labels and problem, whether it reads pairs, a first input (a sentence, and
    a second sentence where it reads pairs); no decoding settings (it does not decode)."""
    model, module = m.model, m.model.module
    cfg = module.body.cfg
    pairs = reads_pairs(model)
    return {"name": m.name, "family": model.family, "capabilities": sorted(model.capabilities),
            "path": str(model.path), "decode": None,
            "attention": {"encoder": {"layers": len(module.body.layers), "heads": cfg.n_heads}},
            "grid": None, "positional": "learned", "max_positions": cfg.max_positions,
            "example": model.kind.example(model), "example_pair": model.kind.example_pair(model),
            "labels": list(module.labels), "problem": module.problem, "pairs": pairs}


# --- the worker's side


def run_batch(batch: list[Job], settings) -> list:
    """-> one answer (a JSON-able dict, or an exception) per job."""
    kind = batch[0].kind
    batched = {"translate": run_translate, "classify": run_classify, "upload": run_upload}.get(kind)
    if batched is not None:  # the jobs that share batches
        return batched(batch, settings)
    job = batch[0]
    try:
        return [RUNNERS[kind](job, settings)]
    except (ApiError, AttnkitError, Abandoned):
        raise
    except ValueError as e:  # a model's own check (e.g. positions past a learned table): the request's fault
        raise ApiError(422, f"request: {' '.join(str(e).split())}") from None


def run_translate(jobs: list[Job], settings) -> list:
    m = jobs[0].served
    model = m.model
    _, _, beam, len_penalty, n_best, attention = jobs[0].key
    sentences = [s for j in jobs for s in j.payload.sentences]
    owners = [(j, i) for j in jobs for i in range(len(j.payload.sentences))]
    on_step = None
    if any(j.streaming for j in jobs):
        # each sentence's source positions (EOS included): a batch's attention rows are padded past them
        lengths = [len(ids) + 1 for ids in model.tokenizers.src.encode([j.payload.sentences[i] for j, i in owners])]
        on_step = step_events(model.target_tokenizer, jobs, owners, lengths, attention)
    results = model.translate(sentences, beam=beam, len_penalty=len_penalty, n_best=n_best,
                              batch_tokens=settings.max_batch_tokens, details=True, need_weights=attention,
                              on_step=on_step)
    answers, start = [], 0
    for j in jobs:
        n = len(j.payload.sentences)
        answers.append(translate_answer(m, results[start:start + n], n_best, attention))
        start += n
    return answers


def translate_answer(m, translations, n_best: int, attention: bool) -> dict:
    toks = m.model.tokenizers
    out = {"model": m.name, "translations": [t.text[0] for t in translations],
           "scores": [_score(t.hypotheses[0].score) for t in translations]}
    if n_best > 1:
        out["hypotheses"] = [[{"text": text, "score": _score(h.score)} for h, text in zip(t.hypotheses, t.text)]
                             for t in translations]
    if attention:
        out["attention"] = []
        for t in translations:
            h = t.hypotheses[0]
            source = m.model.kind.positions(m.model, t.source)
            out["attention"].append({"source": source, "target": list(toks.tgt.id_to_piece(h.tokens)) + ["</s>"],
                                     "weights": [] if h.attention is None else
                                     _rounded(h.attention[:, :len(source)])})
    return out


def step_events(tgt, jobs: list[Job], owners: list[tuple[Job, int]], lengths: list[int], attention: bool):
    """The ``on_step`` of a decoding batch (:meth:`attnkit.api.Model.translate`'s, and an upload's that streams):
    a ``step`` event per live input of each streaming request; stops the search (:class:`Abandoned`) once every
    request of the batch has left. ``tgt``: the tokenizer of the output; ``owners``: each batch row's request and
    its index there; ``lengths``: each row's source positions (a batch's attention rows are padded past them);
    ``attention``: whether the batch's requests asked for attention (a key field, so all or none), which its events
    then carry."""

    def hypothesis(ids: list[int]) -> dict:
        return {"tokens": list(tgt.id_to_piece(ids)), "text": tgt.decode(ids)}

    def on_step(step, batch: list[int]) -> None:
        if all(j.cancelled for j in jobs):
            raise Abandoned
        k = step.scores.size(1)
        wanted = [(p, int(row)) for p, row in enumerate(step.sentences.tolist())
                  if owners[batch[row]][0].streaming and not owners[batch[row]][0].cancelled]
        if not wanted:
            return
        scores = step.scores.tolist()
        ended = set(step.ended)
        for p, row in wanted:
            job, local = owners[batch[row]]
            finished = step.finished[row] if step.finished is not None else None
            rows = range(p * k, p * k + k)
            histories = [step.history[r].tolist() for r in rows]
            if finished is not None and (row in ended or scores[p][0] == float("-inf")):
                best = max(finished, key=lambda h: h.score) if finished else None
                ids, score, done, attn = (best.tokens if best else []), (best.score if best else 0.0), True, None
                if best is not None and best.attention is not None:
                    attn = best.attention[-1]
            else:
                ids = histories[0]
                done = finished is None and (EOS in ids)
                if EOS in ids:
                    ids = ids[:ids.index(EOS)]
                score = scores[p][0]
                attn = None if step.attention is None else step.attention[p * k]
            event = {"sentence": local, "step": step.t, "token": tgt.id_to_piece([ids[-1]])[0] if ids else "",
                     **hypothesis(ids), "score": _score(score), "done": done}
            if k > 1:
                event["beams"] = [{**hypothesis(h), "score": _score(s)} for h, s in zip(histories, scores[p])
                                  if s != float("-inf")]
            if attention and attn is not None:
                event["attention"] = _rounded(attn[:lengths[batch[row]]])
            job.emit("step", event)

    return on_step


# --- classifiers


def run_classify(jobs: list[Job], settings) -> list:
    """Every sentence (or pair) of the batch's requests classified together, then each request's answer; a request
    with ``explain`` (alone in its batch) also gets its sentence's explanation."""
    from attnkit.decode import classify, explain

    if all(j.cancelled for j in jobs):
        raise Abandoned
    m = jobs[0].served
    classifier, tok = m.model.classifier, m.model.tokenizers
    sentences = [s for j in jobs for s in j.payload.sentences]
    pairs = [p for j in jobs for p in j.payload.pairs] if reads_pairs(m.model) else None
    results = classify(classifier, tok, sentences, pairs, batch_tokens=settings.max_batch_tokens)
    answers, start = [], 0
    for j in jobs:
        n = len(j.payload.sentences)
        out = {"model": m.name, "results": [{"label": r.label, "probabilities": r.probabilities, "score": r.score}
                                            for r in results[start:start + n]]}
        if j.payload.explain:
            e = explain(m.model.module, tok, j.payload.sentences[0], j.payload.pairs[0] if pairs is not None else None)
            out["explanation"] = {"pieces": e.pieces, "token_types": list(e.token_types), "label": e.label,
                                  "value": e.value, "occlusion": [round(x, 6) for x in e.occlusion],
                                  "attention": [_rounded(w) for w in e.attention], "rollout": _rounded(e.rollout, 6)}
        answers.append(out)
        start += n
    return answers


# --- language models


def _filtered_probs(log_probs: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The distribution tokens are drawn from: [N, V] -> [N, V] (greedy: all mass on the argmax)."""
    from attnkit.decode import filter_logits, with_temperature

    if temperature == 0:
        return torch.zeros_like(log_probs).scatter_(-1, log_probs.argmax(-1, keepdim=True), 1.0)
    return torch.softmax(filter_logits(with_temperature(log_probs, temperature), top_k, top_p), -1)


def _top(tok, log_probs: torch.Tensor, body) -> list[list]:
    """[V] log-probabilities -> the ``body.top`` most likely [piece, p, q] (q: after temperature and filters)."""
    q = _filtered_probs(log_probs[None], body.temperature, body.top_k, body.top_p)[0]
    p = torch.softmax(log_probs.float(), -1)
    values, ids = p.topk(min(body.top, p.numel()))
    pieces = tok.id_to_piece(ids.tolist())
    return [[piece, round(float(v), 4), round(float(q[i]), 4)] for piece, v, i in zip(pieces, values, ids.tolist())]


def run_generate(job: Job, settings) -> dict:
    from attnkit.decode.lm import fits_one_window

    body, m = job.payload, job.served
    model, tok = m.model, m.model.tokenizers
    ids = tok.encode([body.prompt])[0]
    window = learned_positions(model)
    shown, count = [tok.decode(ids)], [0]

    def on_step(step, attention) -> None:  # one window: each step seen, with its attention and candidates
        if job.cancelled:
            raise Abandoned
        j = step.t - len(ids)
        token = int(step.tokens[0])
        if j < 0 or token == EOS or not body.stream:
            return
        text = tok.decode(step.history[0].tolist())
        event = {"step": j, "token": tok.id_to_piece([token])[0], "text": text[len(shown[0]):]
                 if text.startswith(shown[0]) else text}
        shown[0] = text
        if attention is not None:
            event["attention"] = _rounded(attention)
        if body.top and step.log_probs is not None:
            event["top"] = _top(tok, step.log_probs[0], body)
        job.emit("step", event)

    def on_text(piece: str) -> None:  # a sliding window: the text as it grows
        if job.cancelled:
            raise Abandoned
        if body.stream:
            if count[0] == 0 and ids:  # the prompt, as the model read it: not a new token
                count[0] = -1
                return
            job.emit("step", {"step": max(count[0], 0), "token": piece, "text": piece})
            count[0] = max(count[0], 0) + 1

    watched = (body.stream or body.top or body.attention) and fits_one_window(model.module, len(ids), body.max_tokens)
    c = model.generate(body.prompt, body.max_tokens, body.temperature, body.top_k, body.top_p, body.seed,
                       on_text=on_text, on_step=on_step if watched else None, need_weights=body.attention,
                       details=True)  # on_text and on_step also stop it once the request has left
    all_ids, log_probs = c.hypothesis.tokens, c.hypothesis.log_probs
    new = all_ids[len(ids):]
    text, prompt_text = tok.decode(all_ids), tok.decode(ids)
    out = {"model": m.name, "text": text,
           "completion": text[len(prompt_text):] if text.startswith(prompt_text) else tok.decode(new),
           "tokens": list(tok.id_to_piece(new)), "score": _score(sum(log_probs[len(ids):]))}
    if body.top:
        out["steps"] = _steps_top(model, tok, ids, new, body, window)
    return out


def _steps_top(model, tok, ids: list[int], new: list[int], body, window) -> list[dict]:
    """Per new token, the next-token distribution it was drawn from, from one teacher-forced pass."""
    seq = [BOS] + ids + new
    if not new or (window is not None and len(seq) > window):
        return [{"token": piece, "top": []} for piece in tok.id_to_piece(new)]
    with torch.no_grad():
        logits = model.module(None, torch.tensor([seq[:-1] if len(seq) > 1 else seq])).logits[0]
    log_probs = torch.log_softmax(logits.float(), -1)
    pieces = tok.id_to_piece(new)
    return [{"token": piece, "top": _top(tok, log_probs[len(ids) + j], body)} for j, piece in enumerate(pieces)]


# --- captioners, attention, scores, positions


def run_upload(jobs: list[Job], settings) -> list:
    """A batch of uploads to one model (of one key), answered by the model's input kind
    (:meth:`~attnkit.kinds.InputKind.answer_uploads`); a streaming request's steps go as events. Where the batch
    fails on one request's input (a file the API cannot read after all), each request is answered alone, so that
    the others get their answers."""
    if all(j.cancelled for j in jobs):
        raise Abandoned
    m = jobs[0].served
    model = m.model
    on_step = None
    if any(j.streaming for j in jobs):
        lengths = [model.kind.length(model, j.payload["input"]) for j in jobs]
        # whether attention is asked is a key field of an upload that declares it: the batch agrees
        on_step = step_events(model.target_tokenizer, jobs, [(j, 0) for j in jobs], lengths,
                              jobs[0].payload.get("attention", False))
    try:
        return model.kind.answer_uploads(model, m.name, [j.payload for j in jobs], on_step)
    except (ApiError, AttnkitError):
        if len(jobs) == 1:
            raise
    return [_alone(j, settings) for j in jobs]


def _alone(job: Job, settings):
    try:
        return run_upload([job], settings)[0]
    except (ApiError, AttnkitError, Abandoned) as e:  # its own error (or its client left): the others go on
        return e


def run_attention(job: Job, settings) -> dict:
    m, body = job.served, job.payload["request"]
    model = m.model
    heads = [list(h) for h in body.mask_heads]
    with model.kind.opened(job.payload["input"]) as value:
        att = model.attention(value, body.target, mask_heads=heads, mask_source=body.mask_source)

    def maps(ws):
        return [_rounded(w, body.precision) for w in ws]

    return {"model": m.name, "family": model.family, "source": att.source, "target": att.target, "output": att.text,
            "score": _score(att.score), "encoder": maps(att.encoder), "decoder": maps(att.decoder),
            "cross": maps(att.cross), **model.kind.describe(model),
            "masked": {"heads": heads, "source": sorted(set(body.mask_source))}}


def run_score(job: Job, settings) -> dict:
    m, body = job.served, job.payload
    if not m.model.kind.has_source:
        scores = m.model.score(body.targets)
    else:
        scores = m.model.score(body.sources, body.targets)
    return {"model": m.name, "scores": [_score(s) for s in scores]}


def positional_encoding(model, side: str):
    module = model.module
    names = ("embed",) if not model.kind.has_source else (("src_embed",) if side == "source" else
                                                                  ("tgt_embed",))
    for name in names:
        embed = getattr(module, name, None)
        if embed is not None and hasattr(embed, "positional"):
            return embed.positional
    return None


def run_positional(job: Job, settings) -> dict:
    m, body = job.served, job.payload
    positional = positional_encoding(m.model, body.side)
    if positional is None:
        raise ApiError(422, f"side: {m.name} ({m.model.family}) has no {body.side} positional encoding")
    limit = learned_positions(m.model)
    if limit is not None and body.positions > limit:
        raise ApiError(422, f"positions: {body.positions} is more than the model's {limit} learned positions")
    with torch.no_grad():
        matrix = positional(body.positions, 0).float()
    cfg = getattr(m.model.module, "cfg", None)
    return {"model": m.name, "kind": getattr(cfg, "positional", None), "d_model": matrix.size(-1),
            "matrix": _rounded(matrix), "dot": _rounded(matrix @ matrix.T)}


# the jobs that run one at a time, by the job's kind
RUNNERS = {"generate": run_generate, "attention": run_attention, "score": run_score, "positional": run_positional}
