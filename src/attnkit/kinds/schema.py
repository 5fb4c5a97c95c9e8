"""JSON Schema building blocks for the OpenAPI document (:mod:`attnkit.serve.openapi`) and the input kinds'
fragments of it, and the few helpers that write an answer's values as JSON (rounded maps, finite scores)."""

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


def obj(properties: dict, required=(), closed: bool = True, **more) -> dict:
    """An object schema; ``closed``: no property beyond ``properties``."""
    out = {"type": "object", "properties": properties, "required": list(required), **more}
    if closed:
        out["additionalProperties"] = False
    return out


# --- answers' values as JSON


def rounded(t, decimals: int = 4):
    """A tensor as nested lists of floats rounded to ``decimals`` (attention maps are large)."""
    import torch

    return torch.round(t.double(), decimals=decimals).tolist()


def finite(x: float) -> float:
    """A score as JSON can carry it: rounded to 6 decimals; -1e30 for -inf or NaN (a search with no hypothesis)."""
    return round(float(x), 6) if x == x and abs(x) != float("inf") else -1e30
