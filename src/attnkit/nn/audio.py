"""Audio as the speech families read it: a batch of log-mel frames with each row's length, and what the
listeners do with time (halving it, masking padding)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Frames:
    """A batch of utterances as feature frames: ``features`` [B, T, F] (rows padded with zeros past their end),
    ``lengths`` [B] each row's real frames. It moves and reorders like a tensor (``to``, ``size``,
    ``index_select``), so the decoders' searches pass it through unchanged."""

    features: Tensor
    lengths: Tensor

    @property
    def device(self) -> torch.device:
        return self.features.device

    def to(self, device) -> Frames:
        return Frames(self.features.to(device), self.lengths.to(device))

    def size(self, dim: int | None = None):
        return self.features.size() if dim is None else self.features.size(dim)

    def float(self) -> Frames:
        return Frames(self.features.float(), self.lengths)

    def index_select(self, dim: int, indices: Tensor) -> Frames:
        rows = indices.to(self.lengths.device)
        return Frames(self.features.index_select(0, indices), self.lengths.index_select(0, rows))

    @property
    def padding_mask(self) -> Tensor:
        """[B, T], True past each row's length."""
        return frame_padding_mask(self.lengths, self.features.size(1))


def frame_padding_mask(lengths: Tensor, total: int) -> Tensor:
    """lengths [B] -> [B, total], True at padding (``t >= length``)."""
    return torch.arange(total, device=lengths.device)[None, :] >= lengths[:, None]


def pad_frames(features: list[Tensor]) -> Frames:
    """Utterances [T_i, F] -> one zero-padded :class:`Frames` [B, max T_i, F]."""
    lengths = torch.tensor([f.size(0) for f in features], dtype=torch.long)
    out = features[0].new_zeros(len(features), int(lengths.max()), features[0].size(1))
    for i, f in enumerate(features):
        out[i, : f.size(0)] = f
    return Frames(out, lengths)


def join_neighbours(x: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """The pyramidal BLSTM's time reduction (Chan et al. 2016, eq. 5): ``h_i = [x_{2i}; x_{2i+1}]``.

    x [B, T, D], lengths [B] -> [B, T // 2, 2D], lengths // 2 (an odd last frame is dropped, as a row alone
    drops it; at least one frame is kept)."""
    b, t, d = x.shape
    half = t // 2
    return x[:, : 2 * half].reshape(b, half, 2 * d), (lengths // 2).clamp(min=1)


def conv_lengths(lengths: Tensor, kernel: int = 3, stride: int = 2, padding: int = 1) -> Tensor:
    """Frames a strided convolution keeps: ``floor((L + 2 padding - kernel) / stride) + 1``."""
    return torch.div(lengths + 2 * padding - kernel, stride, rounding_mode="floor") + 1
