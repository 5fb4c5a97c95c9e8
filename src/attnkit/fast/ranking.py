"""The best tokens of wide rows (a whole vocabulary per row), found without a full pass of ``argmax`` or ``topk``.

PyTorch's CPU ``argmax`` and ``topk`` walk each row element by element, while ``amax`` is vectorised: over
[320, 6000] log-probabilities ``argmax`` took 1.9 ms and ``amax`` 0.11 ms on this machine. So both functions
here first take the maximum of every chunk of ``chunk`` columns with ``amax``, then look inside the few
chunks that can hold the answer. Results equal ``torch.argmax`` / ``torch.topk`` (up to the order of tied
values, which ``topk`` leaves unspecified too).
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK = 128
# fewer elements than this: the plain kernels, as the extra steps here cost more than they save; but not in a
# compiled graph, where Inductor fuses the steps (and its own argmax is not vectorised): the chunked search at any size
SMALL = 1 << 17


def _split(x: Tensor, chunk: int) -> tuple[Tensor, Tensor]:
    """x [N, V] -> (the first V // chunk * chunk columns as [N, V // chunk, chunk], the rest [N, V % chunk])."""
    n, v = x.shape
    main = v - v % chunk
    return x[:, :main].unflatten(1, (main // chunk, chunk)), x[:, main:]


def argmax_rows(x: Tensor, chunk: int | None = None) -> Tensor:
    """``x.argmax(-1)`` for x [N, V]: the first index of each row's maximum. -> [N]"""
    n, v = x.shape
    chunk = chunk or CHUNK
    if v < 4 * chunk or x.is_cuda or (not torch.compiler.is_compiling() and x.numel() < SMALL):
        return x.argmax(-1)
    chunks, tail = _split(x, chunk)
    c, t = chunks.size(1), tail.size(1)
    maxima = chunks.amax(-1)  # [N, C]
    if t:
        maxima = torch.cat([maxima, tail.amax(-1, keepdim=True)], 1)
    first = maxima.argmax(-1)  # the first chunk that holds the row's maximum (the tail is chunk C)
    found = first.clamp(max=c - 1) * chunk + chunks[torch.arange(n), first.clamp(max=c - 1)].argmax(-1)
    return torch.where(first == c, c * chunk + tail.argmax(-1), found) if t else found


def best_extensions(scores: Tensor, log_probs: Tensor, n: int, chunk: int | None = None) -> tuple[Tensor, Tensor]:
    """The ``n`` best one-token extensions of each sentence's beams.

    scores [M, K] (each beam's total so far), log_probs [M, K, V] ->
    (values [M, n], indices [M, n] into the flattened K * V candidates), best first, as
    ``(scores[:, :, None] + log_probs).view(M, K * V).topk(n)`` gives them.
    Only chunks whose best candidate ranks among the n best chunk maxima can hold one of the n best.
    """
    m, k, v = log_probs.shape
    chunk = chunk or CHUNK
    if v < 4 * chunk or v // chunk < n or log_probs.is_cuda or (not torch.compiler.is_compiling()
                                                                and log_probs.numel() < SMALL):
        return (scores[:, :, None] + log_probs).view(m, k * v).topk(n, dim=1)
    chunks, tail = _split(log_probs.view(m * k, v), chunk)  # [M K, C, chunk], [M K, T]
    c, t = chunks.size(1), tail.size(1)
    # adding a beam's score keeps the order of its candidates (rounding is monotonic), so chunk maxima rank
    best = (chunks.amax(-1).view(m, k, c) + scores[:, :, None]).view(m, k * c).topk(n, dim=1).indices  # [M, n]
    rows = best // c + torch.arange(m)[:, None] * k  # the beam row [M, n] of each chosen chunk
    picked = chunks[rows, best % c] + scores.view(-1)[rows][..., None]  # [M, n, chunk]
    cand = picked.view(m, n * chunk)
    if t:  # the short last chunk always competes
        cand = torch.cat([cand, (tail.view(m, k, t) + scores[:, :, None]).view(m, k * t)], 1)
    values, pos = cand.topk(n, dim=1)
    in_chunks = pos < n * chunk
    p = pos.clamp(max=n * chunk - 1)
    chosen = best.gather(1, p // chunk)  # the chunk each winner came from
    from_chunk = (chosen // c) * v + (chosen % c) * chunk + p % chunk
    q = (pos - n * chunk).clamp(min=0)
    from_tail = (q // t) * v + (v - t) + q % t if t else from_chunk
    return values, torch.where(in_chunks, from_chunk, from_tail)
