"""Transformer building blocks: position-wise FFN, encoder and decoder layers.

Each sublayer is wrapped as the paper writes it (post-LN)::

    x = LayerNorm(x + Dropout(Sublayer(x)))

or, with ``norm_first``, as pre-LN, which trains deeper stacks without warmup tricks::

    x = x + Dropout(Sublayer(LayerNorm(x)))
"""

from __future__ import annotations

from typing import NamedTuple

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


def init_feed_forward(layers) -> None:
    """Xavier-uniform W_1 [d_ff, d_model] and W_2 [d_model, d_ff], zero b_1 and b_2, in every layer's FFN, as the
    Transformer's other linear layers are initialised. Called once the whole stack is built, so the random draws
    follow the layers' order."""
    for layer in layers:
        for lin in (layer.ffn.linear1, layer.ffn.linear2):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)


class LayerOutput(NamedTuple):
    """What every layer returns. ``x``: its output [B, T, d_model]; ``self_weights``: its self-attention
    [B, H, T, T] and ``cross_weights``: a decoder layer's attention over the memory [B, H, T, S] (None unless
    ``need_weights``; an encoder layer has no cross-attention); ``cache``: the self-attention keys and values
    extended by this step's (decoding with a cache; else None)."""

    x: Tensor
    self_weights: Tensor | None = None
    cross_weights: Tensor | None = None
    cache: KVCache | None = None


class Residual(nn.Module):
    """The residual connection with layer norm around one sublayer, post-LN or pre-LN:
    ``x + Dropout(Sublayer(LayerNorm(x)))`` is :meth:`add` (x, Sublayer(:meth:`sublayer_input` (x)))."""

    def __init__(self, d_model: int, dropout: float, norm_first: bool, eps: float = 1e-5):
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def sublayer_input(self, x: Tensor) -> Tensor:
        """What the sublayer reads: LayerNorm(x) (pre-LN), or x itself (post-LN)."""
        return self.norm(x) if self.norm_first else x

    def add(self, x: Tensor, out: Tensor) -> Tensor:
        """The sublayer's output ``out`` added back: x + Dropout(out) (pre-LN), or LayerNorm(x + Dropout(out))
        (post-LN)."""
        return x + self.dropout(out) if self.norm_first else self.norm(x + self.dropout(out))

    def forward(self, x: Tensor, sublayer) -> Tensor:
        """x [B, T, d_model] -> the residual around ``sublayer`` (a function of a tensor to a tensor)."""
        return self.add(x, sublayer(self.sublayer_input(x)))


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
                causal: bool = False, cache: KVCache | None = None) -> LayerOutput:
        """x [B, S, d_model], padding_mask [B, S] (True = pad) -> LayerOutput(x, self_weights [B, H, S, S] or None,
        cache).

        ``causal`` hides later positions. ``cache`` (decoding, with ``causal``) holds the keys/values of earlier
        steps; the output carries it extended.
        """
        a = self.self_attn(self.attn_res.sublayer_input(x), key_padding_mask=padding_mask, causal=causal,
                           cache=cache, need_weights=need_weights)
        x = self.attn_res.add(x, a.output)
        x = self.ffn_res(x, self.ffn)
        return LayerOutput(x, self_weights=a.weights, cache=a.cache)


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
    ) -> LayerOutput:
        """x [B, T, d_model], memory [B, S, d_model] (or its projection ``memory_kv``, decoding) -> LayerOutput(x,
        self_weights [B, H, T, T], cross_weights [B, H, T, S] (both None unless ``need_weights``), the extended
        self-attention cache).

        Target padding needs no mask here: pads sit after the last real token, so the causal
        mask already hides them from every real position.
        """
        s = self.self_attn(self.self_res.sublayer_input(x), causal=True, cache=cache, need_weights=need_weights)
        x = self.self_res.add(x, s.output)
        c = self.cross_attn(self.cross_res.sublayer_input(x), memory, key_padding_mask=memory_padding_mask,
                            memory_kv=memory_kv, need_weights=need_weights)
        x = self.cross_res.add(x, c.output)
        x = self.ffn_res(x, self.ffn)
        return LayerOutput(x, s.weights, c.weights, s.cache)
