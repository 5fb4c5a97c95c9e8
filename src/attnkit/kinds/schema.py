"""JSON Schema building blocks for the OpenAPI document (:mod:`attnkit.serve.openapi`) and the input kinds'
fragments of it."""

from __future__ import annotations

NUMBER, INTEGER, STRING, BOOLEAN = {"type": "number"}, {"type": "integer"}, {"type": "string"}, {"type": "boolean"}
NULL = {"type": "null"}


def array(items, **bounds) -> dict:
    return {"type": "array", "items": items, **bounds}


def nullable(schema: dict) -> dict:
    return {"anyOf": [schema, NULL]}


def text(description: str, tokens: int | None) -> dict:
    """A string the model's tokenizer reads; ``tokens``: at most that many of its tokens (else 413)."""
    out = {"type": "string", "description": description}
    if tokens is not None:
        out["description"] += f" (at most {tokens} tokens of the model's tokenizer; more: 413)"
        out["x-max-tokens"] = tokens
    return out
