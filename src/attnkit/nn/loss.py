"""The training loss: label-smoothed cross entropy (Szegedy et al. 2016; section 5.4 of the Transformer paper).

Per target token y, with smoothing ``eps`` spread uniformly over the V words (fairseq's and PyTorch's form)::

    loss = (1 - eps) * -log p(y) + eps * mean_v -log p(v)

Padding targets (``ignore_index``) count nothing. The fast runtime's fused versions
(:mod:`attnkit.fast.loss`) give the same values and gradients.

Beside it, speech's auxiliary objective: CTC (Graves et al. 2006) over an encoder's frames, ``-log p(y | x)`` summed
over every alignment of the characters to the frames that a blank may separate (torch's ``ctc_loss``).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float, ignore_index: int = 0) -> tuple[Tensor, Tensor]:
    """Sum over non-pad targets of ``(1 - eps) * -log p(y) + eps * mean_v -log p(v)``.

    logits [..., V], target [...] -> (smoothed loss sum, plain NLL sum ``-log p(y)`` without gradient).
    """
    log_probs = F.log_softmax(logits.float().flatten(0, -2), dim=-1)
    target = target.reshape(-1)
    keep = target.ne(ignore_index)
    nll = -log_probs.gather(1, target.masked_fill(~keep, 0)[:, None]).squeeze(1)
    smooth = -log_probs.mean(-1)
    loss = ((1 - epsilon) * nll + epsilon * smooth).masked_fill(~keep, 0.0).sum()
    return loss, nll.masked_fill(~keep, 0.0).sum().detach()


def projected_label_smoothed_nll(hidden: Tensor, weight: Tensor, target: Tensor, epsilon: float = 0.0,
                                 ignore_index: int = 0) -> tuple[Tensor, Tensor]:
    """The output projection, then :func:`label_smoothed_nll`: ``logits = hidden W^T``.

    hidden [..., d], weight [V, d] (a bias-free output layer), target [...] -> (smoothed loss sum, NLL sum).
    """
    return label_smoothed_nll(hidden @ weight.t(), target, epsilon, ignore_index)


def ctc_nll(log_probs: Tensor, lengths: Tensor, targets: Tensor, target_lengths: Tensor, blank: int) -> Tensor:
    """``-log p(y | x) = -log sum_{a in B^-1(y)} prod_t p(a_t | x)`` summed over the batch, where B removes repeats
    and then blanks from a frame-wise labelling a (Graves et al. 2006, eq. 2-3; torch's ``ctc_loss``).

    log_probs [B, T, V] (log-softmax over the labels, ``blank`` among them), lengths [B] (real frames),
    targets [B, S] (padded), target_lengths [B] -> the sum; an utterance too short for its labels counts zero."""
    return F.ctc_loss(log_probs.float().transpose(0, 1), targets, lengths, target_lengths, blank=blank,
                      reduction="sum", zero_infinity=True)
