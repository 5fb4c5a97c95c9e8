"""Model families. ``build_model`` turns a ModelConfig and vocabulary sizes into a module."""

from __future__ import annotations

from attnkit.config import ModelConfig
from attnkit.models.transformer import BOS, EOS, PAD, UNK, Transformer


def build_model(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int):
    if cfg.family == "transformer":
        return Transformer(cfg, src_vocab_size, tgt_vocab_size)
    raise ValueError(f"unknown model family {cfg.family!r}")


__all__ = ["BOS", "EOS", "PAD", "UNK", "Transformer", "build_model"]
