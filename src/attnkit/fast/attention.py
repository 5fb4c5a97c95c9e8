"""Attention kernels faster than :func:`attnkit.nn.attention.reference_attention`, with its signature and results.

* :func:`teacher_forced_attention`: what training and teacher-forced passes run. Over short keys (fewer than
  :data:`SHORT_KEYS`, sentences) it is :func:`short_attention`, two batched matrix products and a softmax; over
  longer ones PyTorch's ``scaled_dot_product_attention``, whose flash kernel never builds the [T, S] weights; in a
  compiled graph without autograd, :func:`broadcast_attention`, which the compiler makes loops of.
* :func:`single_query_attention`: a decoding step, where each row has one query (or a source sentence's beams,
  all seeing the same keys): two batched matrix products cost a third of SDPA's kernel at these shapes.

:func:`make_kernel` combines them; a request for the weights always runs the reference, which returns them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.nn.attention import attention_mask, reference_attention


def single_query_attention(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
    """softmax(q k^T / sqrt(d_head)) v for a decoding step: q [B, H, G, d_head] with G queries per row that all
    see every key (one, or the beams of one source sentence in cross-attention), k and v [B, H, S, d_head],
    key_padding_mask [B, S] (True = pad) -> [B, H, G, d_head].

    Every cached key is visible to the last query: no causal mask. A row that is all padding gets a zero
    output, as in the reference.
    """
    b, h, g, dh = q.shape
    if torch.compiler.is_compiling():
        # Written as broadcast products and sums, Inductor turns the whole function into a few loops of its own;
        # the batched matmuls below are each a library call on [G, d_head] x [d_head, S] blocks, which costs more
        # than the arithmetic (docs/performance.md)
        scores = (q[:, :, :, None, :] * k[:, :, None, :, :]).sum(-1) * dh**-0.5  # [B, H, G, S]
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        return (torch.softmax(scores, dim=-1).nan_to_num(0.0)[..., None] * v[:, :, None, :, :]).sum(-2)
    s = k.size(2)
    q, k, v = q.reshape(b * h, g, dh), k.reshape(b * h, s, dh), v.reshape(b * h, s, dh)
    if key_padding_mask is None:
        weights = torch.softmax(torch.bmm(q, k.transpose(1, 2)) * dh**-0.5, dim=-1)
    else:
        bias = q.new_zeros(b, 1, s).masked_fill_(key_padding_mask[:, None, :], float("-inf"))  # [B, 1, S]
        scores = torch.baddbmm(bias.repeat_interleave(h, dim=0), q, k.transpose(1, 2), alpha=dh**-0.5)
        weights = torch.softmax(scores, dim=-1).nan_to_num_(0.0)  # an all-padding row: zero weights, not NaN
    return torch.bmm(weights, v).view(b, h, g, dh)


# Below this many keys, two batched products and a softmax beat SDPA's flash kernel, forward and backward, at most
# lengths: up to 2.7x for the sentences of a translation batch (1,500 tokens, 4 heads of 32, one core of an AMD EPYC
# Zen 4), still ahead at 48 keys, behind only at 32 and 33; at 64 they tie and beyond it flash wins, and it never
# holds the [T, S] weights (docs/performance.md)
SHORT_KEYS = 64
# PyTorch's CPU softmax over fewer elements than one vector register holds takes a scalar path: over 15 keys it ran
# 12x slower than over 16, forward, and 23x backward. Shorter key rows are padded to this many, with zero weight
VECTOR_KEYS = 16


def _empty_rows(key_padding_mask: Tensor | None) -> Tensor | None:
    """[B, 1, 1, 1], True where a sequence is all padding: its queries see no key, and get zeros, not NaN (the
    kernels let them attend to everything, then zero them). None where no sequence is: eager code skips the fix-up
    in the usual case, but a compiled graph must not branch on data, so it always gets the mask."""
    if key_padding_mask is None:
        return None
    empty = key_padding_mask.all(dim=-1)[:, None, None, None]
    return empty if torch.compiler.is_compiling() or empty.any() else None


def short_attention(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None, causal: bool = False,
                    dropout: float = 0.0) -> Tensor:
    """softmax(q k^T / sqrt(d_head) + bias) v, with the masks as an additive bias (-inf where a key is padding or in
    the future): q [B, H, T, d_head], k and v [B, H, S, d_head], key_padding_mask [B, S] (True = pad) -> [B, H, T,
    d_head]. ``dropout`` drops attention weights, as the core does.

    Fewer than :data:`VECTOR_KEYS` keys are padded to that many for the softmax, under a -inf bias: their weights
    are exactly zero, and dropped before the values are weighted. A query that sees no key gets a zero output, as in the
    reference.
    """
    b, h, t, dh = q.shape
    s = k.size(2)
    width = max(s, VECTOR_KEYS)
    allowed = attention_mask(t, s, key_padding_mask, causal, q.device)  # the core's masks, True = allowed
    bias = None  # [B or 1, 1, T or 1, width] or [T, width]
    if allowed is not None or width > s:
        allowed = torch.ones(1, s, dtype=torch.bool, device=q.device) if allowed is None else allowed
        allowed = F.pad(allowed, (0, width - s), value=False)
        bias = q.new_zeros(allowed.shape).masked_fill_(~allowed, float("-inf"))
    empty = _empty_rows(key_padding_mask)
    if empty is not None:
        bias = bias.masked_fill(empty, 0.0)
    keys = F.pad(k, (0, 0, 0, width - s)) if width > s else k
    # scaled in place, after the product: bmm's backward needs not its output, and the scores are the smaller side
    scores = torch.bmm(q.reshape(b * h, t, dh), keys.reshape(b * h, width, dh).transpose(1, 2)).mul_(dh**-0.5)
    if bias is not None:
        scores = scores.view(b, h, t, width).add_(bias).view(b * h, t, width)
    weights = torch.softmax(scores, dim=-1)[..., :s]  # the padding's weights are zero: dropped
    if dropout > 0:
        weights = F.dropout(weights, dropout)
    out = torch.bmm(weights, v.reshape(b * h, s, dh)).view(b, h, t, dh)
    return out if empty is None else out.masked_fill(empty, 0.0)


def broadcast_attention(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None,
                        causal: bool = False) -> Tensor:
    """softmax(q k^T / sqrt(d_head) + mask) v written as broadcast products and sums (:func:`short_attention`'s
    signature, without dropout), for a compiled graph without autograd: Inductor turns it into a few loops of its
    own. An encoder's self-attention over a sentence in SDPA's flash kernel, built for blocks of hundreds of keys,
    took nearly a third of the time of a one-sentence encoder package (the Multi30k model, AMD EPYC Zen 5; py-spy).
    A query that sees no key gets a zero output, as in the reference."""
    t, s, dh = q.size(2), k.size(2), q.size(3)
    scores = (q[:, :, :, None, :] * k[:, :, None, :, :]).sum(-1) * dh**-0.5  # [B, H, T, S]
    allowed = attention_mask(t, s, key_padding_mask, causal, q.device)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (weights[..., None] * v[:, :, None, :, :]).sum(-2)


def teacher_forced_attention(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None,
                             causal: bool = False, dropout: float = 0.0) -> Tensor:
    """Attention without its weights for a whole sequence of queries (:func:`short_attention`'s signature): that
    function over fewer than :data:`SHORT_KEYS` keys on a CPU, else PyTorch's SDPA. A compiled graph cannot branch
    on its dynamic key length: one without autograd on a CPU (a decoder's encoder) runs :func:`broadcast_attention`,
    one with autograd SDPA."""
    if q.device.type == "cpu" and torch.compiler.is_compiling():
        if not torch.is_grad_enabled() and dropout == 0.0:
            return broadcast_attention(q, k, v, key_padding_mask, causal)
    elif k.size(2) < SHORT_KEYS and q.device.type == "cpu":
        return short_attention(q, k, v, key_padding_mask, causal, dropout)
    return _sdpa(q, k, v, key_padding_mask, causal, dropout)


def _sdpa(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, causal: bool, dropout: float) -> Tensor:
    t, s = q.size(2), k.size(2)
    if causal and t == s and key_padding_mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=t > 1)
    mask = attention_mask(t, s, key_padding_mask, causal, q.device)
    empty = _empty_rows(key_padding_mask)
    if empty is not None:
        mask = mask | empty
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
    return out if empty is None else out.masked_fill(empty, 0.0)


def make_kernel(fused: bool = True, decoding: bool = True):
    """An attention kernel (:func:`~attnkit.nn.attention.reference_attention`'s signature): ``fused``:
    :func:`teacher_forced_attention` for teacher-forced passes; ``decoding``: :func:`single_query_attention` for
    one query per row without autograd (a decoding step). Anything else, and every request for the weights, runs
    the reference."""

    def kernel(q: Tensor, k: Tensor, v: Tensor, *, key_padding_mask: Tensor | None = None, causal: bool = False,
               dropout: float = 0.0, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        if not need_weights:
            if decoding and q.size(2) == 1 and dropout == 0.0 and not torch.is_grad_enabled():
                return single_query_attention(q, k, v, key_padding_mask), None
            if fused:
                return teacher_forced_attention(q, k, v, key_padding_mask, causal, dropout), None
        return reference_attention(q, k, v, key_padding_mask=key_padding_mask, causal=causal, dropout=dropout,
                                   need_weights=need_weights)

    kernel.fused, kernel.decoding = fused, decoding
    return kernel
