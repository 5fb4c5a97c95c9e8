"""A vocabulary shortlist: each decoding step scores only the target tokens that may translate the batch's source
(CTranslate2's ``use_vmap``, Marian's lexical shortlist), where the output projection and its softmax over the
whole vocabulary are most of a narrow model's step.

For the shortlist ``ids`` [K] (sorted, the special tokens first) the step's log-probabilities are those of the
softmax over the shortlist alone:

    log p(ids_j | y_<t, x) = z_j - log sum_{i < K} exp(z_i),    z = h W[ids]^T + b[ids]

which equal the whole vocabulary's distribution restricted to the shortlist and renormalized. The special tokens
come first (``ids[:4]`` = PAD, UNK, BOS, EOS), so EOS's position is its id and a search may compare a position with
EOS; it maps positions to token ids through ``ids`` (:attr:`~attnkit.models.contract.DecodingState.vocabulary`).

The output layer's rows for the shortlist are gathered once a batch (:func:`shortlisted_output`), in the precision
of the layer they come from: fp32 or bf16 weights, or int8 weights with their per-row scales, multiplied as
:class:`~attnkit.fast.precision.Int8Linear` multiplies.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.fast.precision import Int8Linear, quantize_rows
from attnkit.tokens import EOS


def output_rows(output: nn.Module) -> tuple[Tensor, Tensor, Tensor]:
    """The output layer ``output`` (``nn.Linear``, an ``Int8Linear``, or any module with a ``weight`` buffer
    [d_model, V], as the compiled decoder keeps it) as rows to gather a shortlist's from: (weight [V, d_model]
    row-major, in the layer's dtype or int8 for an ``Int8Linear``; scale [V], the int8 rows' scales, ones
    otherwise; bias [V], zeros where the layer has none). Gathering whole rows of a row-major matrix took a
    fraction of the time of gathering columns of the [d_model, V] layout the compiled decoder multiplies by."""
    if isinstance(output, Int8Linear):
        weight, scale = output.q_weight, output.w_scale.float()
    else:
        weight = output.weight if isinstance(output, nn.Linear) else output.weight.t()
        scale = torch.ones(weight.size(0), device=weight.device)
    bias = getattr(output, "bias", None)
    bias = torch.zeros(weight.size(0), device=weight.device) if bias is None else bias.float()
    return weight.contiguous(), scale, bias.to(weight.dtype if weight.is_floating_point() else torch.float32)


def shortlisted_output(rows: tuple[Tensor, Tensor, Tensor], ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The rows ``ids`` [K] of an output layer (its :func:`output_rows`) -> (weight [1, K, d_model], scale [1, K],
    bias [1, K]), each with a first dim of 1 (a compiled graph's constant: the length K is a symbol). The weight
    stays row-major, multiplied as its transpose: transposing it once a sentence took longer than the transposed
    products of that sentence's steps (AMD EPYC Zen 5, one thread)."""
    if ids.dim() != 1 or ids.numel() <= EOS or int(ids[EOS]) != EOS:
        raise ValueError("a shortlist is [K] token ids, sorted, with the special tokens first")
    weight, scale, bias = rows
    return (weight.index_select(0, ids)[None], scale.index_select(0, ids).view(1, -1),
            bias.index_select(0, ids).view(1, -1))


def shortlisted_logits(h: Tensor, weight: Tensor, scale: Tensor, bias: Tensor) -> Tensor:
    """z = h W^T + b over the shortlist: h [N, d_model], the tensors of :func:`shortlisted_output` -> [N, K].
    int8 weights multiply int8 activations (one scale per row of h) in int32, as ``Int8Linear`` does."""
    if weight.dtype == torch.int8:
        q_h, h_scale = quantize_rows(h)
        return torch._int_mm(q_h, weight[0].t()).float() * h_scale * scale + bias
    return h @ weight[0].t() + bias


__all__ = ["output_rows", "shortlisted_logits", "shortlisted_output"]
