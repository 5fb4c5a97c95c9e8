"""The JSON bodies the API reads (the contract: :mod:`attnkit.serve.app`'s docstring). Strict: a string is not
a number, an unknown field is an error. An integer is what JSON Schema calls one: ``3`` or ``3.0``, not ``3.5``
(the OpenAPI document's ``"type": "integer"`` admits both)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


def _integral(value):
    """A float with no fractional part is the integer it equals (JSON does not tell 3 from 3.0)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Integer = Annotated[int, BeforeValidator(_integral)]


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, protected_namespaces=())

    model: str | None = Field(None, description="a name from GET /v1/models (default: the first model)")


class TranslateRequest(Request):
    sentences: list[str] = Field(..., min_length=1, description="source sentences")
    beam: Integer | None = Field(None, ge=1, description="beam size; 1 is greedy (default: the checkpoint's)")
    len_penalty: float | None = Field(None, ge=0, le=10, description="default: the checkpoint's")
    n_best: Integer = Field(1, ge=1, description="hypotheses per sentence (at most beam)")
    attention: bool = Field(False, description="also the cross-attention of each translation")
    stream: bool = Field(False, description="server-sent events, one per decided token")


class GenerateRequest(Request):
    prompt: str = ""
    max_tokens: Integer = Field(100, ge=0, description="new tokens at most")
    temperature: float = Field(1.0, ge=0, le=100, description="0: greedy")
    top_k: Integer = Field(0, ge=0, description="sample among the k most likely (0: all)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling")
    seed: Integer | None = Field(None, ge=0, lt=2**63, description="fixes the sample")
    stream: bool = False
    attention: bool = Field(False, description="stream: each step's self-attention row")
    top: Integer = Field(0, ge=0, le=50, description="per new token, this many most likely next tokens")


class AttentionRequest(Request):
    source: str | None = Field(None, description="the sentence (a language model's text)")
    image: str | None = Field(None, description="captioners: the image file, base64")
    target: str | None = Field(None, description="null: the model's own output")
    mask_heads: list[list[str | Integer]] = Field(
        default_factory=list, description='[[kind, layer, head], ...]: kind "encoder", "decoder" or "cross", '
                                          "layer and head from 0")
    mask_source: list[Integer] = Field(default_factory=list, description="source positions to hide")
    precision: Integer = Field(4, ge=1, le=8, description="decimals of the weights")


class ScoreRequest(Request):
    sources: list[str] | None = Field(None, description="omit for a language model")
    targets: list[str] = Field(..., min_length=1)


class PositionalRequest(Request):
    positions: Integer = Field(50, ge=1, le=2048)
    side: Literal["source", "target"] = "source"


class ClassifyRequest(Request):
    sentences: list[str] = Field(..., min_length=1, description="sentences (a pair model's first sentences)")
    pairs: list[str] | None = Field(None, description="the second sentence of each pair: exactly for a model "
                                                      "fine-tuned on pairs")
    explain: bool = Field(False, description="also why (occlusion, attention, rollout): one sentence only")
