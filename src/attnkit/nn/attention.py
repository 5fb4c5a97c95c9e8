"""Attention as the lectures define it.

The general form: a query ``q`` is compared with every key ``k_j`` by a similarity
function ``f_att``; a softmax turns the scores into weights ``a_j``; the output is the
weighted sum of the values ``sum_j a_j v_j``. :func:`attend` is that formula for many
queries at once. :class:`MultiHeadAttention` is the Transformer's version, with
masks, a key/value cache for decoding, and a fast path through PyTorch's fused
``scaled_dot_product_attention`` when nobody asks for the weights (so the full
attention matrix is never built).

Mask convention throughout: a boolean ``mask`` is True where attention is *allowed*;
``key_padding_mask`` is True at *padding* positions (as in ``torch.nn.MultiheadAttention``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# --- similarity functions f_att(q, k): queries [B, T, d_q], keys [B, S, d_k] -> scores [B, T, S]


def dot_score(queries: Tensor, keys: Tensor) -> Tensor:
    """Dot product ``q . k`` (Luong "dot")."""
    return queries @ keys.transpose(-1, -2)


def scaled_dot_score(queries: Tensor, keys: Tensor) -> Tensor:
    """Scaled dot product ``q . k / sqrt(d_k)`` (Vaswani et al.): keeps the softmax out of saturation."""
    return queries @ keys.transpose(-1, -2) / math.sqrt(keys.size(-1))


class Score(nn.Module):
    """A similarity function as a module. ``precompute(keys)`` is the part that depends on the keys
    only, so a decoder computes it once per source and passes it back as ``projected``."""

    def precompute(self, keys: Tensor) -> Tensor:
        return keys

    def forward(self, queries: Tensor, keys: Tensor, projected: Tensor | None = None) -> Tensor:
        raise NotImplementedError


class DotScore(Score):
    def __init__(self, scaled: bool = False):
        super().__init__()
        self.scaled = scaled

    def forward(self, queries: Tensor, keys: Tensor, projected: Tensor | None = None) -> Tensor:
        return (scaled_dot_score if self.scaled else dot_score)(queries, keys)


class GeneralScore(Score):
    """Bilinear ``q^T W k`` (Luong "general")."""

    def __init__(self, d_query: int, d_key: int):
        super().__init__()
        self.weight = nn.Linear(d_key, d_query, bias=False)

    def precompute(self, keys: Tensor) -> Tensor:
        return self.weight(keys)

    def forward(self, queries: Tensor, keys: Tensor, projected: Tensor | None = None) -> Tensor:
        wk = self.weight(keys) if projected is None else projected
        return queries @ wk.transpose(-1, -2)


class AdditiveScore(Score):
    """Bahdanau's MLP ``v^T tanh(W q + U k)``: one tanh hidden layer of size ``d_hidden``."""

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


def masked_softmax(scores: Tensor, mask: Tensor | None) -> Tensor:
    """Softmax over the last axis where ``mask`` allows; a row with nothing allowed gets all-zero weights (no NaN)."""
    if mask is None:
        return torch.softmax(scores, dim=-1)
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights.nan_to_num(0.0)


def attend(queries: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None = None, score=scaled_dot_score):
    """The lectures' attention: ``e = f_att(q, k)``, ``a = softmax(e)``, ``out = sum_j a_j v_j``.

    queries [B, T, d_q], keys [B, S, d_k], values [B, S, d_v], mask [B, T, S] or broadcastable
    (True = allowed). Returns outputs [B, T, d_v] and weights [B, T, S].
    """
    weights = masked_softmax(score(queries, keys), mask)
    return weights @ values, weights


def causal_mask(t: int, s: int | None = None, device=None) -> Tensor:
    """[t, s] boolean, True where query i may see key j (j <= i + s - t): the future stays hidden."""
    s = t if s is None else s
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(diagonal=s - t)


def single_query_attention(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
    """softmax(q k^T / sqrt(d_head)) v for a decoding step: q [B, H, G, d_head] with G queries per row that all
    see every key (one, or the beams of one source sentence in cross-attention), k and v [B, H, S, d_head],
    key_padding_mask [B, S] (True = pad) -> [B, H, G, d_head].

    Pads get a large negative score, not -inf: a row that is all padding (no real key) averages
    its values instead of producing NaN. Every causal key is visible to the last query: no causal mask.
    """
    b, h, g, dh = q.shape
    if torch.compiler.is_compiling():
        # Written as broadcast products and sums, Inductor turns the whole function into a few loops of its own;
        # the batched matmuls below are each a library call on [G, d_head] x [d_head, S] blocks, which costs more
        # than the arithmetic. A compiled step of a random Multi30k-sized model: 4.0 against 4.1-5.0 ms for 37 rows,
        # 1.4 against 1.9 ms for a 5-beam one (bench/translate_throughput.py has the end-to-end numbers)
        scores = (q[:, :, :, None, :] * k[:, :, None, :, :]).sum(-1) * dh**-0.5  # [B, H, G, S]
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[:, None, None, :], torch.finfo(q.dtype).min)
        return (torch.softmax(scores, dim=-1)[..., None] * v[:, :, None, :, :]).sum(-2)
    s = k.size(2)
    q, k, v = q.reshape(b * h, g, dh), k.reshape(b * h, s, dh), v.reshape(b * h, s, dh)
    if key_padding_mask is None:
        scores = torch.bmm(q, k.transpose(1, 2)) * dh**-0.5
    else:
        bias = key_padding_mask[:, None, :].to(q.dtype) * torch.finfo(q.dtype).min  # [B, 1, S]
        scores = torch.baddbmm(bias.repeat_interleave(h, dim=0), q, k.transpose(1, 2), alpha=dh**-0.5)
    return torch.bmm(torch.softmax(scores, dim=-1), v).view(b, h, g, dh)


# --- multi-head attention


@dataclass
class KVCache:
    """Keys and values of one attention layer, [B, H, S, d_head], grown one step at a time.

    ``order`` [B'] is a row selection not yet applied (:meth:`reorder`): the next step gathers the rows as it
    appends its own keys and values, one copy of the cache where gathering first would make two.
    """

    keys: Tensor
    values: Tensor
    order: Tensor | None = None

    def select(self, indices: Tensor) -> KVCache:
        keys, values = self.resolved()
        return KVCache(keys.index_select(0, indices), values.index_select(0, indices))

    @property
    def rows(self) -> int:
        return self.keys.size(0) if self.order is None else self.order.size(0)

    def reorder(self, indices: Tensor) -> KVCache:
        """:meth:`select`, left for the next step to apply."""
        # a fresh tensor, not a view: a compiled step guards on a view's base, and would compile again for it
        order = indices.clone() if self.order is None else self.order.index_select(0, indices)
        return KVCache(self.keys, self.values, order)

    def resolved(self) -> tuple[Tensor, Tensor]:
        """(keys, values) with ``order`` applied."""
        if self.order is None:
            return self.keys, self.values
        return self.keys.index_select(0, self.order), self.values.index_select(0, self.order)

    def append(self, keys: Tensor, values: Tensor) -> KVCache:
        """These keys and values [B', H, t, d_head] after the cached ones (reordered)."""
        past_keys, past_values = self.resolved()  # compiled, the gather and the cat are one kernel
        return KVCache(torch.cat([past_keys, keys], dim=2), torch.cat([past_values, values], dim=2))


class MultiHeadAttention(nn.Module):
    """``MultiHead(Q, K, V) = Concat(head_1..head_h) W^O`` with ``head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)``.

    The three input projections live in one ``in_proj`` [3 d_model, d_model] (the layout of
    ``torch.nn.MultiheadAttention``): self-attention does one fused matmul for Q, K and V;
    cross-attention projects the decoder states with the first third and the encoder
    memory with the other two.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.dropout = dropout
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        nn.init.xavier_uniform_(self.in_proj.weight)
        if bias:
            nn.init.zeros_(self.in_proj.bias)
            nn.init.zeros_(self.out_proj.bias)

    def _split(self, x: Tensor) -> Tensor:  # [B, T, d_model] -> [B, H, T, d_head]
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.d_head).transpose(1, 2)

    def project_memory(self, memory: Tensor) -> KVCache:
        """Keys and values of the encoder memory for cross-attention, computed once per sentence."""
        d, bias = self.d_model, self.in_proj.bias
        k, v = F.linear(memory, self.in_proj.weight[d:], None if bias is None else bias[d:]).chunk(2, dim=-1)
        # contiguous once here, so each decoding step's batched matmuls read them without a copy
        return KVCache(self._split(k).contiguous(), self._split(v).contiguous())

    def forward(
        self,
        queries: Tensor,
        memory: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
        static_kv: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None, KVCache | None]:
        """queries [B, T, d_model]; memory [B, S, d_model] for cross-attention (None: self-attention).

        key_padding_mask [B, S] (True = pad); ``causal`` hides future keys; ``cache`` holds the
        keys/values of earlier decoding steps (self-attention) and is returned extended;
        ``static_kv`` is :meth:`project_memory` of the memory (cross-attention while decoding).
        Returns (outputs [B, T, d_model], weights [B, H, T, S] or None, new cache or None).
        """
        d = self.d_model
        if memory is None and static_kv is None:  # self-attention: one fused projection
            q, k, v = self.in_proj(queries).chunk(3, dim=-1)
            q, k, v = self._split(q), self._split(k), self._split(v)
            if cache is not None:
                cache = cache.append(k, v)
                k, v = cache.keys, cache.values
        else:
            b = None if self.in_proj.bias is None else self.in_proj.bias[:d]
            q = self._split(F.linear(queries, self.in_proj.weight[:d], b))
            kv = static_kv if static_kv is not None else self.project_memory(memory)
            k, v = kv.keys, kv.values
        t, s = q.size(2), k.size(2)

        mask = None  # [B or 1, 1, T or 1, S], True = allowed
        if key_padding_mask is not None:
            mask = ~key_padding_mask[:, None, None, :]
        if causal and t > 1:
            cm = causal_mask(t, s, device=q.device)
            mask = cm if mask is None else mask & cm

        dropout = self.dropout if self.training else 0.0
        if (t == 1 or static_kv is not None) and not need_weights and dropout == 0.0 and not torch.is_grad_enabled():
            # a decoding step (one query per row, or a source's beams against its keys and values): two batched
            # matmuls cost a third of SDPA's kernel here
            out, weights = single_query_attention(q, k, v, key_padding_mask), None
        elif need_weights:
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.d_head)
            weights = masked_softmax(scores, mask)
            out = F.dropout(weights, dropout, self.training) @ v
        else:
            weights = None
            if causal and t == s and key_padding_mask is None:
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=t > 1)
            else:
                empty = None
                if mask is not None and key_padding_mask is not None:
                    # a sequence that is all padding has no key to attend to: give it zeros, not NaN. Eager code
                    # skips that when no row is empty (the usual case); a compiled graph must not branch on data
                    empty = key_padding_mask.all(dim=-1)[:, None, None, None]
                    if torch.compiler.is_compiling() or empty.any():
                        mask = mask | empty
                    else:
                        empty = None
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
                if empty is not None:
                    out = out.masked_fill(empty, 0.0)
        out = out.transpose(1, 2).reshape(queries.size(0), t, d)
        return self.out_proj(out), weights, cache
