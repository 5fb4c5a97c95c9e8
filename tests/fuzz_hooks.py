"""Schemathesis hooks for tests/test_openapi.py's fuzzer (loaded by ``st run`` through SCHEMATHESIS_HOOKS).

Two things a generator cannot know from JSON Schema alone:
* What an image is. The document says the caption upload is ``image/*`` and the attention endpoint's ``image`` is
  base64 (``format: byte``); real PNGs of random sizes and colours are drawn for both, so that schema-valid
  requests are valid requests.
* The rules the document states outside JSON Schema, each named there (``x-max-tokens`` on a text, ``x-rules`` on
  a body) with the status a request breaking it gets. A generated body that breaks one is dropped: the server
  must refuse it, which tests/test_serve_faults.py checks. The token counts use the served models' own
  tokenizers (ATTNKIT_FUZZ_MODELS: {"name": checkpoint path}); a body naming no model is read as the one the
  document makes its path's default.
"""

from __future__ import annotations

import base64
import io
import json
import os
from functools import cache

import schemathesis
from hypothesis import strategies as st


@st.composite
def png(draw) -> bytes:
    from PIL import Image

    size = (draw(st.integers(1, 64)), draw(st.integers(1, 64)))
    colour = tuple(draw(st.integers(0, 255)) for _ in range(3))
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


@st.composite
def wav(draw) -> bytes:
    """A real clip: a tone of 0.2-2 s at 8, 16 or 44.1 kHz (an audio upload the document admits)."""
    import numpy as np
    import soundfile

    rate = draw(st.sampled_from([8000, 16000, 44100]))
    seconds, freq = draw(st.floats(0.2, 2.0)), draw(st.floats(100.0, 3000.0))
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    soundfile.write(buf, (0.3 * np.sin(2 * np.pi * freq * t)).astype("float32"), rate, format="WAV")
    return buf.getvalue()


schemathesis.openapi.media_type("image/png", png())
schemathesis.openapi.media_type("audio/wav", wav())
schemathesis.openapi.format("byte", png().map(lambda data: base64.b64encode(data).decode()))


@cache
def _models() -> dict:
    import attnkit

    return {name: attnkit.load(path) for name, path in json.loads(os.environ["ATTNKIT_FUZZ_MODELS"]).items()}


@cache
def _document() -> dict:
    import httpx

    return httpx.get(os.environ["ATTNKIT_FUZZ_URL"] + "/openapi.json").json()


def _branch(path: str, name: str) -> dict:
    """The request schema of ``path`` for the model ``name``."""
    schema = _document()["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    for branch in schema.get("oneOf", [schema]):
        if name in branch["properties"]["model"]["enum"]:
            return branch
    return {}


def _default(path: str) -> str | None:
    """The model a body naming none gets at ``path``: the branch whose ``model`` may be null."""
    schema = _document()["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    for branch in schema.get("oneOf", [schema]):
        if None in branch["properties"]["model"]["enum"]:
            return branch["properties"]["model"]["enum"][0]
    return None


def _tokens(model, text: str) -> int:
    """Tokens as ``x-max-tokens`` counts them: a classifier's word pieces without [CLS] and [SEP] (its ``encode``
    would add them and cut the text), others' source tokens."""
    toks = model.tokenizers
    if "classify" in model.capabilities:
        return len(toks.ids(text))
    return len((toks.src if hasattr(toks, "src") else toks).encode([text])[0])


def _within_token_limits(model, branch: dict, body: dict) -> bool:
    """Every text under a property with ``x-max-tokens`` has at most that many tokens."""
    for key, schema in branch.get("properties", {}).items():
        value = body.get(key)
        for s in (schema, *schema.get("anyOf", ()), schema.get("items", {})):
            limit = s.get("x-max-tokens") if isinstance(s, dict) else None
            texts = value if isinstance(value, list) else [value]
            if limit is not None and any(isinstance(t, str) and _tokens(model, t) > limit for t in texts):
                return False
    return True


def _int(value):
    """An integer as JSON Schema counts them (3 or 3.0), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return int(value)
    return None


@schemathesis.hook
def filter_case(context, case) -> bool:
    """Applied in every phase (coverage and fuzzing) to the whole request."""
    return follows_rules(case.operation.path, case.body)


def follows_rules(path: str, body) -> bool:
    if path == "/v1/answer" and isinstance(body, dict) and isinstance(body.get("question"), str):
        # x-max-words, and a question a form field carries as it is (no control characters, not only spaces)
        question = body["question"]
        return bool(question.strip()) and len(question.split()) <= _document()["paths"]["/v1/answer"]["post"][
            "requestBody"]["content"]["multipart/form-data"]["schema"]["properties"]["question"]["x-max-words"] \
            and not any(ord(c) < 32 or 127 <= ord(c) < 160 for c in question)
    if not isinstance(body, dict) or path not in ("/v1/translate", "/v1/generate", "/v1/attention", "/v1/score",
                                                  "/v1/classify"):
        return True
    models = _models()
    name = body.get("model") or _default(path)
    model = models.get(name) if isinstance(name, str) else None
    if model is None:
        return True
    branch = _branch(path, name)
    if not _within_token_limits(model, branch, body):
        return False
    if path == "/v1/classify":
        return _classify_rules(model, branch, body)
    if path == "/v1/translate":  # x-rules: n_best <= beam
        beam = model.config.decode.beam_size if body.get("beam") is None else _int(body["beam"])
        n_best = _int(body.get("n_best", 1))
        return beam is None or n_best is None or n_best <= beam
    if path == "/v1/score":  # x-rules: as many sources as targets
        sources, targets = body.get("sources"), body.get("targets")
        return not (isinstance(sources, list) and isinstance(targets, list)) or len(sources) == len(targets)
    if path == "/v1/attention":  # x-rules: each position < the source's tokens, EOS included
        positions, source = body.get("mask_source"), body.get("source")
        if isinstance(positions, list) and positions and isinstance(source, str) and "caption" not in \
                model.capabilities and model.family != "transformer_lm":
            return all(_int(p) is None or _int(p) < _tokens(model, source) + 1 for p in positions)
    return True


def _classify_rules(model, branch: dict, body: dict) -> bool:
    """x-rules of a classifier: as many pairs as sentences, each pair's word pieces together within x-max-tokens;
    explain with exactly one sentence."""
    sentences, pairs = body.get("sentences"), body.get("pairs")
    if not isinstance(sentences, list):
        return True
    if body.get("explain") is True and len(sentences) != 1:
        return False
    if isinstance(pairs, list) and "pairs" in branch.get("required", ()):
        if len(pairs) != len(sentences):
            return False
        limit = branch["properties"]["sentences"]["items"]["x-max-tokens"]
        return all(not (isinstance(a, str) and isinstance(b, str)) or _tokens(model, a) + _tokens(model, b) <= limit
                   for a, b in zip(sentences, pairs))
    return True
