"""Position information: the paper's sinusoids and learned position embeddings."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoidal_table(n_positions: int, d_model: int) -> Tensor:
    """``PE(pos, 2i) = sin(pos / 10000^(2i/d_model))``, ``PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))``.

    Returns [n_positions, d_model]; even columns hold sines, odd columns cosines, as the paper writes it.
    """
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    angles = pos / torch.pow(10000.0, two_i / d_model)
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return table.float()


class SinusoidalPositionalEncoding(nn.Module):
    """Adds no parameters; a buffer, recomputed rather than saved in checkpoints."""

    def __init__(self, d_model: int, max_positions: int = 1024):
        super().__init__()
        self.register_buffer("table", sinusoidal_table(max_positions, d_model), persistent=False)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """Positions offset .. offset + length - 1 -> [length, d_model]. Python ints, not a tensor of positions:
        an exported decoding step is then traced without a data-dependent branch."""
        if offset + length > self.table.size(0):
            self.table = sinusoidal_table(2 * (offset + length), self.table.size(1)).to(self.table.device)
        return self.table[offset:offset + length]


class LearnedPositionalEmbedding(nn.Module):
    def __init__(self, d_model: int, max_positions: int = 1024):
        super().__init__()
        self.embedding = nn.Embedding(max_positions, d_model)
        # on the scale of the sqrt(d_model)-scaled token embeddings (unit variance, like the sinusoids):
        # at GPT-2's 0.02 positions were 50x weaker than tokens, and a character LM sat on the bigram
        # plateau far longer (Tiny Shakespeare: validation 2.48 vs 2.22 after 400 steps)
        nn.init.normal_(self.embedding.weight, std=1.0)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """Positions offset .. offset + length - 1 -> [length, d_model]."""
        if offset + length > self.embedding.num_embeddings:
            raise ValueError(f"position {offset + length - 1} beyond max_positions={self.embedding.num_embeddings}")
        return self.embedding.weight[offset:offset + length]


def make_positional(kind: str, d_model: int, max_positions: int) -> nn.Module:
    if kind == "sinusoidal":
        return SinusoidalPositionalEncoding(d_model, max_positions)
    if kind == "learned":
        return LearnedPositionalEmbedding(d_model, max_positions)
    raise ValueError(f"unknown positional encoding {kind!r}")


class TokenEmbedding(nn.Module):
    """Token embedding scaled by ``sqrt(d_model)`` (section 3.4), plus positions, then dropout.

    ``tokens`` replaces the plain ``nn.Embedding`` lookup, e.g. by ``attnkit.nn.AdaptiveInput``.
    """

    def __init__(self, vocab_size: int, d_model: int, positional: nn.Module, dropout: float, padding_idx: int = 0,
                 tokens: nn.Module | None = None):
        super().__init__()
        if tokens is None:
            tokens = nn.Embedding(vocab_size, d_model, padding_idx=padding_idx)
            nn.init.normal_(tokens.weight, std=d_model**-0.5)
            with torch.no_grad():
                tokens.weight[padding_idx].zero_()
        self.tokens = tokens
        self.positional = positional
        self.scale = math.sqrt(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, tokens: Tensor, offset: int = 0) -> Tensor:
        """tokens [B, T] -> [B, T, d_model]; ``offset`` is the position of the first token (decoding)."""
        return self.dropout(self.tokens(tokens) * self.scale + self.positional(tokens.size(1), offset))
