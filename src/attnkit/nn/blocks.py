"""Transformer building blocks: position-wise FFN, encoder and decoder layers.

Each sublayer is wrapped as the paper writes it (post-LN)::

    x = LayerNorm(x + Dropout(Sublayer(x)))

or, with ``norm_first``, as pre-LN, which trains deeper stacks without warmup tricks::

    x = x + Dropout(Sublayer(LayerNorm(x)))
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.nn.attention import KVCache, MultiHeadAttention


class FeedForward(nn.Module):
    """``FFN(x) = max(0, x W_1 + b_1) W_2 + b_2`` (or GELU)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu"):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.activation = {"relu": F.relu, "gelu": F.gelu}[activation]
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class Residual(nn.Module):
    """The residual connection with layer norm around one sublayer, post-LN or pre-LN."""

    def __init__(self, d_model: int, dropout: float, norm_first: bool, eps: float = 1e-5):
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, sublayer) -> tuple[Tensor, tuple]:
        """``sublayer(h)`` returns (output, *extras); the extras (weights, cache) pass through."""
        if self.norm_first:  # pre-LN: x + Dropout(Sublayer(LayerNorm(x)))
            out, *extras = sublayer(self.norm(x))
            return x + self.dropout(out), tuple(extras)
        out, *extras = sublayer(x)  # post-LN: LayerNorm(x + Dropout(Sublayer(x)))
        return self.norm(x + self.dropout(out)), tuple(extras)


class EncoderLayer(nn.Module):
    """Self-attention, then the FFN. With ``causal`` it is also a decoder-only (GPT) layer: no cross-attention.

    ``layer_norm_eps`` is 1e-12 for BERT's weights; PyTorch's default 1e-5 elsewhere.
    """

    def __init__(self, d_model, n_heads, d_ff, dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
                 activation="relu", norm_first=False, layer_norm_eps=1e-5):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.ffn = FeedForward(d_model, d_ff, activation_dropout, activation)
        self.attn_res = Residual(d_model, dropout, norm_first, layer_norm_eps)
        self.ffn_res = Residual(d_model, dropout, norm_first, layer_norm_eps)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None, need_weights: bool = False, *,
                causal: bool = False, cache: KVCache | None = None):
        """x [B, S, d_model], padding_mask [B, S] (True = pad) -> (x, self-attention weights [B, H, S, S] or None).

        ``causal`` hides later positions. ``cache`` (decoding, with ``causal``) holds the keys/values of earlier
        steps; it is then returned extended as a third element: (x, weights, cache).
        """
        x, (weights, new_cache) = self.attn_res(x, lambda h: self.self_attn(
            h, key_padding_mask=padding_mask, causal=causal, cache=cache, need_weights=need_weights))
        x, _ = self.ffn_res(x, lambda h: (self.ffn(h),))
        return (x, weights) if cache is None else (x, weights, new_cache)


class DecoderLayer(nn.Module):
    """Masked self-attention, then encoder-decoder (cross) attention, then the FFN."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
                 activation="relu", norm_first=False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.ffn = FeedForward(d_model, d_ff, activation_dropout, activation)
        self.self_res = Residual(d_model, dropout, norm_first)
        self.cross_res = Residual(d_model, dropout, norm_first)
        self.ffn_res = Residual(d_model, dropout, norm_first)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        memory_padding_mask: Tensor | None = None,
        *,
        cache: KVCache | None = None,
        memory_kv: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None, KVCache | None]:
        """x [B, T, d_model], memory [B, S, d_model] (or its projection ``memory_kv``, decoding) -> (x,
        self-attention weights [B, H, T, T], cross-attention weights [B, H, T, S] (both None unless
        ``need_weights``), the extended self-attention cache).

        Target padding needs no mask here: pads sit after the last real token, so the causal
        mask already hides them from every real position.
        """
        x, (self_weights, cache) = self.self_res(x, lambda h: self.self_attn(h, causal=True, cache=cache,
                                                                              need_weights=need_weights))
        x, (cross_weights, _) = self.cross_res(x, lambda h: self.cross_attn(
            h, memory, key_padding_mask=memory_padding_mask, memory_kv=memory_kv, need_weights=need_weights))
        x, _ = self.ffn_res(x, lambda h: (self.ffn(h),))
        return x, self_weights, cross_weights, cache
