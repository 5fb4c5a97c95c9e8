"""Label-smoothed cross entropy (Szegedy et al. 2016; section 5.4 of the Transformer paper)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float, ignore_index: int = 0) -> tuple[Tensor, Tensor]:
    """Sum over non-pad tokens of ``(1 - eps) * -log p(y) + eps * mean_v -log p(v)``.

    The smoothing mass ``eps`` is spread uniformly over the whole vocabulary (fairseq's and
    PyTorch's form), so PyTorch's fused kernel computes it without materialising log-probs twice.
    logits [..., V], target [...] -> (smoothed loss sum, plain NLL sum without gradient).
    """
    logits = logits.float().flatten(0, -2)
    target = target.reshape(-1)
    loss = F.cross_entropy(logits, target, ignore_index=ignore_index, label_smoothing=epsilon, reduction="sum")
    with torch.no_grad():
        keep = target.ne(ignore_index)
        nll = (logits.logsumexp(-1) - logits.gather(1, target[:, None]).squeeze(1))[keep].sum()
    return loss, nll
