"""Attention kernels faster than :func:`attnkit.nn.attention.reference_attention`, with its signature and results.

* :func:`fused_attention`: PyTorch's ``scaled_dot_product_attention``, which never builds the [T, S] weights
  (flash or memory-efficient kernels): what training and teacher-forced passes run.
* :func:`single_query_attention`: a decoding step, where each row has one query (or a source sentence's beams,
  all seeing the same keys): two batched matrix products cost a third of SDPA's kernel at these shapes.

:func:`make_kernel` combines them; a request for the weights always runs the reference, which returns them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.nn.attention import reference_attention


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


def _sdpa(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, causal: bool, dropout: float) -> Tensor:
    t, s = q.size(2), k.size(2)
    if causal and t == s and key_padding_mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=t > 1)
    mask = None
    if key_padding_mask is not None:
        mask = ~key_padding_mask[:, None, None, :]
    if causal and t > 1:
        future = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(diagonal=s - t)
        mask = future if mask is None else mask & future
    empty = None
    if key_padding_mask is not None:
        # a sequence that is all padding has no key to attend to: zeros, not NaN. Eager code skips that when no
        # row is empty (the usual case); a compiled graph must not branch on data
        empty = key_padding_mask.all(dim=-1)[:, None, None, None]
        if torch.compiler.is_compiling() or empty.any():
            mask = mask | empty
        else:
            empty = None
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
    return out if empty is None else out.masked_fill(empty, 0.0)


def make_kernel(fused: bool = True, decoding: bool = True):
    """An attention kernel (:func:`~attnkit.nn.attention.reference_attention`'s signature): ``fused``:
    SDPA for teacher-forced passes; ``decoding``: :func:`single_query_attention` for one query per row without
    autograd (a decoding step). Anything else, and every request for the weights, runs the reference."""

    def kernel(q: Tensor, k: Tensor, v: Tensor, *, key_padding_mask: Tensor | None = None, causal: bool = False,
               dropout: float = 0.0, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        if not need_weights:
            if decoding and q.size(2) == 1 and dropout == 0.0 and not torch.is_grad_enabled():
                return single_query_attention(q, k, v, key_padding_mask), None
            if fused:
                return _sdpa(q, k, v, key_padding_mask, causal, dropout), None
        return reference_attention(q, k, v, key_padding_mask=key_padding_mask, causal=causal, dropout=dropout,
                                   need_weights=need_weights)

    kernel.fused, kernel.decoding = fused, decoding
    return kernel
