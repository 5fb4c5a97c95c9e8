"""Attention as the lectures define it.

The general form: a query ``q`` is compared with every key ``k_j`` by a similarity function ``f_att``;
a softmax turns the scores into weights ``a_j``; the output is the weighted sum of the values::

    e_j = f_att(q, k_j)        a = softmax(e)        out = sum_j a_j v_j

:func:`attend` is that formula for many queries at once, and :class:`MultiHeadAttention` runs it once per
head. Everything here is the reference: the fast runtime (:mod:`attnkit.fast`) swaps in fused kernels by
name and is tested equal to these functions.

Mask convention throughout: a boolean ``mask`` is True where attention is *allowed*;
``key_padding_mask`` is True at *padding* positions (as in ``torch.nn.MultiheadAttention``).
A query with no allowed key at all (a fully padded row) gets zero weights and a zero output, never NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# --- similarity functions f_att(q, k): queries [B, T, d_q], keys [B, S, d_k] -> scores [B, T, S]


def dot_score(queries: Tensor, keys: Tensor) -> Tensor:
    """Dot product ``e = q . k`` (Luong "dot")."""
    return queries @ keys.transpose(-1, -2)


def scaled_dot_score(queries: Tensor, keys: Tensor) -> Tensor:
    """Scaled dot product ``e = q . k / sqrt(d_k)`` (Vaswani et al.): keeps the softmax out of saturation."""
    return queries @ keys.transpose(-1, -2) / math.sqrt(keys.size(-1))


class Score(nn.Module):
    """A similarity function as a module. ``precompute(keys)`` is the part that depends on the keys
    only, so a decoder computes it once per source and passes it back as ``projected``."""

    def precompute(self, keys: Tensor) -> Tensor:
        return keys

    def forward(self, queries: Tensor, keys: Tensor, projected: Tensor | None = None) -> Tensor:
        raise NotImplementedError


class DotScore(Score):
    """``e = q . k``, or ``q . k / sqrt(d_k)`` when ``scaled``; no parameters."""

    def __init__(self, scaled: bool = False):
        super().__init__()
        self.scaled = scaled

    def forward(self, queries: Tensor, keys: Tensor, projected: Tensor | None = None) -> Tensor:
        return (scaled_dot_score if self.scaled else dot_score)(queries, keys)


class GeneralScore(Score):
    """Bilinear ``e = q^T W k`` (Luong "general")."""

    def __init__(self, d_query: int, d_key: int):
        super().__init__()
        self.weight = nn.Linear(d_key, d_query, bias=False)

    def precompute(self, keys: Tensor) -> Tensor:
        return self.weight(keys)

    def forward(self, queries: Tensor, keys: Tensor, projected: Tensor | None = None) -> Tensor:
        wk = self.weight(keys) if projected is None else projected
        return queries @ wk.transpose(-1, -2)


class AdditiveScore(Score):
    """Bahdanau's MLP ``e = v^T tanh(W q + U k)``: one tanh hidden layer of size ``d_hidden``."""

    def __init__(self, d_query: int, d_key: int, d_hidden: int):
        super().__init__()
        self.query_proj = nn.Linear(d_query, d_hidden, bias=False)
        self.key_proj = nn.Linear(d_key, d_hidden, bias=True)
        self.v = nn.Linear(d_hidden, 1, bias=False)

    def precompute(self, keys: Tensor) -> Tensor:
        return self.key_proj(keys)

    def forward(self, queries: Tensor, keys: Tensor, projected: Tensor | None = None) -> Tensor:
        uk = self.key_proj(keys) if projected is None else projected  # [B, S, h]
        wq = self.query_proj(queries)  # [B, T, h]
        return self.v(torch.tanh(wq.unsqueeze(2) + uk.unsqueeze(1))).squeeze(-1)


def make_score(kind: str, d_query: int, d_key: int, d_hidden: int | None = None) -> Score:
    """Build a similarity function by name: dot | scaled_dot | general | additive."""
    if kind in ("dot", "scaled_dot"):
        if d_query != d_key:
            raise ValueError(f"{kind} attention needs queries and keys of one size, got {d_query} and {d_key}")
        return DotScore(scaled=kind == "scaled_dot")
    if kind == "general":
        return GeneralScore(d_query, d_key)
    if kind == "additive":
        return AdditiveScore(d_query, d_key, d_hidden or d_key)
    raise ValueError(f"unknown attention score {kind!r} (dot, scaled_dot, general, additive)")


# --- the attention formula


def masked_softmax(scores: Tensor, mask: Tensor | None) -> Tensor:
    """``a_j = exp(e_j) / sum_{j' allowed} exp(e_j')`` where ``mask`` allows j, 0 elsewhere.

    scores [..., S], mask broadcastable to them (True = allowed). A row with nothing allowed gets all-zero
    weights (no NaN).
    """
    if mask is None:
        return torch.softmax(scores, dim=-1)
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return weights.nan_to_num(0.0)


def attend(queries: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None = None, score=scaled_dot_score,
           dropout: float = 0.0) -> tuple[Tensor, Tensor]:
    """The lectures' attention: ``e = f_att(q, k)``, ``a = softmax(e)``, ``out = sum_j a_j v_j``.

    queries [..., T, d_q], keys [..., S, d_k], values [..., S, d_v], mask [..., T, S] or broadcastable
    (True = allowed). ``dropout`` drops attention weights while training (the Transformer's attention
    dropout). Returns outputs [..., T, d_v] and the weights [..., T, S] (before dropout).
    """
    weights = masked_softmax(score(queries, keys), mask)
    dropped = F.dropout(weights, dropout) if dropout > 0 else weights
    return dropped @ values, weights


def causal_mask(t: int, s: int | None = None, device=None) -> Tensor:
    """[t, s] boolean, True where query i may see key j (j <= i + s - t): the future stays hidden."""
    s = t if s is None else s
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(diagonal=s - t)


def attention_mask(t: int, s: int, key_padding_mask: Tensor | None, causal: bool, device=None) -> Tensor | None:
    """The keys each query may see, [B or 1, 1, t, s] (True = allowed): not padding and, if ``causal``,
    not in the future. None when everything is allowed."""
    mask = None
    if key_padding_mask is not None:
        mask = ~key_padding_mask[:, None, None, :]
    if causal and t > 1:
        future = causal_mask(t, s, device=device)
        mask = future if mask is None else mask & future
    return mask


def reference_attention(queries: Tensor, keys: Tensor, values: Tensor, *, key_padding_mask: Tensor | None = None,
                        causal: bool = False, dropout: float = 0.0,
                        need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
    """Scaled dot-product attention of every head, through :func:`attend`.

    queries [B, H, T, d_head], keys and values [B, H, S, d_head], key_padding_mask [B, S] (True = pad).
    Returns outputs [B, H, T, d_head] and the weights [B, H, T, S] (None unless ``need_weights``).
    This is the signature of every attention kernel a :class:`MultiHeadAttention` can run
    (:mod:`attnkit.fast.attention` has the fused ones).
    """
    mask = attention_mask(queries.size(-2), keys.size(-2), key_padding_mask, causal, queries.device)
    out, weights = attend(queries, keys, values, mask, scaled_dot_score, dropout)
    return out, weights if need_weights else None


# --- multi-head attention


@dataclass
class KVCache:
    """Keys and values of one attention layer, [B, H, S, d_head], grown one decoding step at a time."""

    keys: Tensor
    values: Tensor

    def append(self, keys: Tensor, values: Tensor) -> KVCache:
        """These keys and values [B, H, t, d_head] after the cached ones."""
        return KVCache(torch.cat([self.keys, keys], dim=2), torch.cat([self.values, values], dim=2))

    def select(self, indices: Tensor) -> KVCache:
        """Rows ``indices`` [B'] of the batch (reordered, repeated or dropped)."""
        return KVCache(self.keys.index_select(0, indices), self.values.index_select(0, indices))


class AttentionOutput(NamedTuple):
    """What :class:`MultiHeadAttention` returns: ``output`` [B, T, d_model], ``weights`` [B, H, T, S] (None unless
    asked for) and ``cache``, the self-attention keys and values extended by this step's (None without one)."""

    output: Tensor
    weights: Tensor | None
    cache: KVCache | None


class MultiHeadAttention(nn.Module):
    """``MultiHead(Q, K, V) = Concat(head_1..head_h) W^O`` with ``head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)``.

    The three input projections live in one ``in_proj`` [3 d_model, d_model] (the layout of
    ``torch.nn.MultiheadAttention``): self-attention does one matmul for Q, K and V; cross-attention
    projects the decoder states with the first third and the encoder memory with the other two.

    ``kernel`` computes the heads' attention from the projected queries, keys and values; it is
    :func:`reference_attention` unless the fast runtime installed another (``attnkit.fast.use``). ``linear``
    computes cross-attention's projections with slices of ``in_proj``: ``F.linear``, unless the fast runtime
    installed another.
    """

    kernel = staticmethod(reference_attention)
    linear = staticmethod(F.linear)

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if n_heads < 1 or d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads} (at least 1)")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.dropout = dropout
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        nn.init.xavier_uniform_(self.in_proj.weight)
        if bias:
            nn.init.zeros_(self.in_proj.bias)
            nn.init.zeros_(self.out_proj.bias)

    def split_heads(self, x: Tensor) -> Tensor:
        """[B, T, d_model] -> [B, H, T, d_head]."""
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.d_head).transpose(1, 2)

    def project_queries(self, queries: Tensor) -> Tensor:
        """``Q W^Q`` with the first third of ``in_proj``: [B, T, d_model] -> [B, H, T, d_head]."""
        d, bias = self.d_model, self.in_proj.bias
        return self.split_heads(self.linear(queries, self.in_proj.weight[:d], None if bias is None else bias[:d]))

    def project_memory(self, memory: Tensor) -> KVCache:
        """``K W^K`` and ``V W^V`` of the encoder memory [B, S, d_model], computed once per sentence."""
        d, bias = self.d_model, self.in_proj.bias
        k, v = self.linear(memory, self.in_proj.weight[d:], None if bias is None else bias[d:]).chunk(2, dim=-1)
        # contiguous once here, so each decoding step reads them without a copy
        return KVCache(self.split_heads(k).contiguous(), self.split_heads(v).contiguous())

    def forward(
        self,
        queries: Tensor,
        memory: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
        memory_kv: KVCache | None = None,
        need_weights: bool = False,
    ) -> AttentionOutput:
        """queries [B, T, d_model]; memory [B, S, d_model] for cross-attention (None: self-attention).

        key_padding_mask [B, S] (True = pad); ``causal`` hides future keys; ``cache`` holds the keys and
        values of earlier decoding steps (self-attention) and is returned extended; ``memory_kv`` is
        :meth:`project_memory` of the memory (cross-attention while decoding).
        Returns AttentionOutput(output [B, T, d_model], weights [B, H, T, S] or None, the extended cache or None).
        """
        if memory is None and memory_kv is None:  # self-attention: one projection for Q, K and V
            q, k, v = (self.split_heads(x) for x in self.in_proj(queries).chunk(3, dim=-1))
            if cache is not None:
                cache = cache.append(k, v)
                k, v = cache.keys, cache.values
        else:
            q = self.project_queries(queries)
            kv = memory_kv if memory_kv is not None else self.project_memory(memory)
            k, v = kv.keys, kv.values
        out, weights = self.kernel(q, k, v, key_padding_mask=key_padding_mask, causal=causal,
                                   dropout=self.dropout if self.training else 0.0, need_weights=need_weights)
        out = out.transpose(1, 2).reshape(queries.size(0), q.size(2), self.d_model)  # Concat(head_1..head_h)
        return AttentionOutput(self.out_proj(out), weights, cache)
