"""Image grids in, captions out, through the same search as translation."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.decode.search import Hypothesis, generate


@dataclass
class Caption:
    hypotheses: list[Hypothesis]  # best first; attention [len + 1, L] over grid cells when asked for
    text: list[str]


@torch.no_grad()
def caption(model, vocab, features: Tensor, beam_size: int = 3, len_penalty: float = 1.0, max_len: int = 30,
            batch_size: int = 64, n_best: int = 1, need_weights: bool = False) -> list[Caption]:
    """features [N, L, D] (one grid per image, any dtype) -> N captions."""
    model.eval()
    out = []
    for start in range(0, features.size(0), batch_size):
        grids = features[start:start + batch_size].float()
        lens = torch.full((grids.size(0),), max_len)
        for hyps in generate(model, grids, lens, beam_size, len_penalty, n_best, need_weights):
            out.append(Caption(hyps, [vocab.decode(h.tokens) for h in hyps]))
    return out
