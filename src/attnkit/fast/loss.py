"""Label-smoothed cross entropy with one softmax and a hand-written gradient: the fast runtime's version of
:func:`attnkit.nn.loss.label_smoothed_nll` (same values and gradients, tested)::

    loss = (1 - eps) * -log p(y) + eps * mean_v -log p(v),     d loss / d logits = p - (1 - eps) onehot(y) - eps / V

:func:`smoothed_cross_entropy` has the same value and gradient as ``F.cross_entropy(label_smoothing=eps,
reduction="sum")``, and one softmax serves the loss, the plain NLL (for logging) and the gradient. PyTorch's
makes log-probs, a separate gradient for each of its two terms and their sum, and the NLL needs another
log-sum-exp: here the forward reads the logits three times (softmax, max, sum) and the probabilities once
(max), and the backward turns the saved softmax into the gradient in place. Measured on one core for
[1500, 6000] logits, forward and backward with the NLL: 14 ms against 32 ms.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _softmax_terms(logits: Tensor, target: Tensor, keep: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """logits [N, V] -> (softmax [N, V], smoothed loss sum, NLL sum) over the rows where ``keep`` [N] is 1."""
    probs = torch.softmax(logits, -1)
    # log-sum-exp from the largest probability, which is at least 1/V and never underflows: it belongs to the
    # largest logit, so lse = max logit - log(max probability) (amax, unlike max, returns no indices: 7x faster)
    lse = logits.amax(-1) - probs.amax(-1).log()
    nll = lse - logits.gather(1, target[:, None]).squeeze(1)
    smooth = lse - logits.sum(-1) / logits.shape[-1]  # mean over the vocabulary of -log p(v)
    return probs, (((1 - eps) * nll + eps * smooth) * keep).sum(), (nll * keep).sum()


def _logit_grad_(probs: Tensor, target: Tensor, scale: Tensor, eps: float) -> Tensor:
    """Turn softmax [N, V] in place into ``scale * (p - (1 - eps) onehot - eps / V)``; scale [N]."""
    probs.sub_(eps / probs.shape[-1]).mul_(scale[:, None])
    return probs.scatter_add_(1, target[:, None], (-(1 - eps) * scale)[:, None])


class _SmoothedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, keep: Tensor, eps: float):
        probs, loss, nll = _softmax_terms(logits, target, keep, eps)
        ctx.save_for_backward(probs, target, keep)
        ctx.eps = eps
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        probs, target, keep = ctx.saved_tensors
        # the saved softmax becomes the gradient in place: autograd's version check refuses a second backward
        return _logit_grad_(probs, target, keep * grad_loss, ctx.eps), None, None, None


def _flat(target: Tensor, ignore_index: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    target = target.reshape(-1)
    keep = target.ne(ignore_index)
    return target.masked_fill(~keep, 0), keep.to(dtype)


def smoothed_cross_entropy(logits: Tensor, target: Tensor, eps: float = 0.0,
                           ignore_index: int = 0) -> tuple[Tensor, Tensor]:
    """logits [..., V], target [...] -> (smoothed loss summed over non-``ignore_index`` targets, NLL sum)."""
    logits = logits.float().flatten(0, -2)
    target, keep = _flat(target, ignore_index, logits.dtype)
    if torch.is_grad_enabled() and logits.requires_grad:
        return _SmoothedCrossEntropy.apply(logits, target, keep, float(eps))
    _, loss, nll = _softmax_terms(logits, target, keep, float(eps))
    return loss, nll


class _ProjectedSmoothedCrossEntropy(torch.autograd.Function):
    """The output projection and the smoothed loss as one step, so that the [N, V] matrix is made once (the
    logits, turned into the softmax in place) and read only by the two matrix products of the backward.

    The gradient's two cheap terms are applied to the products' small sides instead of to the [N, V] matrix:
    (p - eps/V - (1-eps) onehot) @ W  = p @ W - eps/V sum_v W_v - (1-eps) W_y, and likewise for the weight.
    """

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, target: Tensor, eps: float):
        with torch.autocast(hidden.device.type, enabled=False):  # the softmax's logits in fp32 under autocast
            return _ProjectedSmoothedCrossEntropy._forward(ctx, hidden, weight, target, eps)

    @staticmethod
    def _forward(ctx, hidden: Tensor, weight: Tensor, target: Tensor, eps: float):
        probs = hidden @ weight.t()
        top = probs.amax(-1)
        torch.softmax(probs, -1, out=probs)
        lse = top - probs.amax(-1).log()  # as in _softmax_terms
        nll = lse - (hidden * weight[target]).sum(-1)
        smooth = lse - hidden @ weight.mean(0)  # mean over the vocabulary of -log p(v), from the logits' mean
        ctx.save_for_backward(probs, hidden, weight, target)
        ctx.eps = eps
        nll_sum = nll.sum()
        ctx.mark_non_differentiable(nll_sum)
        return (1 - eps) * nll_sum + eps * smooth.sum(), nll_sum

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        probs, hidden, weight, target = ctx.saved_tensors
        eps, n_vocab = ctx.eps, weight.shape[0]
        grad_hidden = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_hidden = probs @ weight - (eps / n_vocab) * weight.sum(0) - (1 - eps) * weight[target]
            grad_hidden *= grad_loss
        if ctx.needs_input_grad[1]:
            grad_weight = probs.t() @ hidden
            grad_weight -= (eps / n_vocab) * hidden.sum(0)
            grad_weight.index_add_(0, target, hidden, alpha=-(1 - eps))
            grad_weight *= grad_loss
        return grad_hidden, grad_weight, None, None


def projected_smoothed_cross_entropy(hidden: Tensor, weight: Tensor, target: Tensor, eps: float = 0.0,
                                     ignore_index: int = 0) -> tuple[Tensor, Tensor]:
    """``smoothed_cross_entropy(hidden @ weight.T, target, eps)``, computing logits only where the target is kept.

    hidden [..., D], weight [V, D] (a bias-free output projection), target [...] -> (smoothed loss sum, NLL sum).
    Padding rows cost nothing: they are dropped before the projection. On one core, for [75, 20] positions (10%
    padding), V = 6,000 and D = 128, forward and backward took 81 to 88 ms against 93 to 103 ms for the
    projection of every position followed by :func:`smoothed_cross_entropy` (six alternating runs of each).
    """
    keep = target.reshape(-1).ne(ignore_index)
    hidden = hidden.reshape(-1, hidden.shape[-1])[keep].float()
    target = target.reshape(-1)[keep]
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _ProjectedSmoothedCrossEntropy.apply(hidden, weight.float(), target, float(eps))
    with torch.autocast(hidden.device.type, enabled=False):
        return smoothed_cross_entropy(hidden @ weight.float().t(), target, eps, ignore_index=-1)
