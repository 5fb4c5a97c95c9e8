"""The training loss: label-smoothed cross entropy (Szegedy et al. 2016; section 5.4 of the Transformer paper)."""

from __future__ import annotations

from torch import Tensor

from attnkit.nn.loss import smoothed_cross_entropy


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float, ignore_index: int = 0) -> tuple[Tensor, Tensor]:
    """Sum over non-pad tokens of ``(1 - eps) * -log p(y) + eps * mean_v -log p(v)``.

    The smoothing mass ``eps`` is spread uniformly over the whole vocabulary (fairseq's and PyTorch's
    form: the same value and gradient as ``F.cross_entropy(label_smoothing=eps, reduction="sum")``), and one
    softmax serves the loss, the NLL and the gradient (:mod:`attnkit.nn.loss`).
    logits [..., V], target [...] -> (smoothed loss sum, plain NLL sum without gradient).
    """
    return smoothed_cross_entropy(logits, target, epsilon, ignore_index)
