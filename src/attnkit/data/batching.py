"""Batches bucketed by length and capped by a token budget, in a reproducible order.

The order of an epoch depends only on (seed, epoch), so training resumed mid-epoch
sees exactly the batches it would have seen.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from attnkit.data.tokenizer import BOS, EOS, PAD


@dataclass
class Batch:
    src: Tensor  # [B, S]
    tgt_in: Tensor  # [B, T]: BOS + target
    tgt_out: Tensor  # [B, T]: target + EOS
    indices: list[int]  # positions in the dataset

    @property
    def n_tokens(self) -> int:
        return int(self.tgt_out.ne(PAD).sum())

    def to(self, device: torch.device) -> Batch:
        if self.src.device == device:
            return self
        return Batch(self.src.to(device), self.tgt_in.to(device), self.tgt_out.to(device), self.indices)


def token_batches(src_lens, tgt_lens, max_tokens: int, seed: int | None = None, epoch: int = 0,
                  max_examples: int = 0) -> list[list[int]]:
    """Group examples of similar length so that ``len(batch) * longest <= max_tokens`` and, when ``max_examples``
    (0: no limit), ``len(batch) <= max_examples``.

    ``seed=None`` keeps the corpus order inside buckets and the batch order sorted (for
    decoding); otherwise ties are broken and batches shuffled by ``(seed, epoch)``.
    Lengths count the BOS/EOS the batch adds.
    """
    src_lens = np.asarray(src_lens) + 1
    tgt_lens = np.asarray(tgt_lens) + 1
    if seed is None:
        order = np.lexsort((np.arange(len(src_lens)), tgt_lens, src_lens))
    else:
        rng = np.random.default_rng([seed, epoch])
        order = np.lexsort((rng.random(len(src_lens)), tgt_lens, src_lens))
    batches, current, longest = [], [], 0
    for i in order:
        size = max(src_lens[i], tgt_lens[i])
        full = (len(current) + 1) * max(longest, size) > max_tokens or (max_examples and len(current) >= max_examples)
        if current and full:
            batches.append(current)
            current, longest = [], 0
        current.append(int(i))
        longest = max(longest, size)
    if current:
        batches.append(current)
    if seed is not None:
        rng.shuffle(batches)
    return batches


def pad(seqs: list[list[int]], value: int = PAD) -> Tensor:
    out = torch.full((len(seqs), max(len(s) for s in seqs)), value, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out


def collate(src: list[list[int]], tgt: list[list[int]], indices: list[int]) -> Batch:
    return Batch(
        src=pad([s + [EOS] for s in src]),
        tgt_in=pad([[BOS] + t for t in tgt]),
        tgt_out=pad([t + [EOS] for t in tgt]),
        indices=indices,
    )
