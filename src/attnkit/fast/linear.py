"""Linear layers whose fp32 products are oneDNN's, for training on a CPU where those are the faster ones.

PyTorch multiplies fp32 matrices on the CPU with MKL, which left to itself runs its AVX2 code on an AMD CPU. On an
AMD EPYC Zen 5, whose cores run 512-bit vectors at full width, oneDNN's fp32 products of the Multi30k model's training
shapes (1,500 rows by 128 to 384 columns) ran at about twice that MKL's rate, forward and in both gradients (a
throwaway timing); with MKL choosing its kernels by the CPU's instructions (:mod:`attnkit.mkl`) MKL is the faster. So
:class:`OneDNNLinear` computes ``y = x W^T + b`` and its gradients ``dx = dy W`` and ``dW = dy^T x`` as oneDNN
products, and :func:`onednn_pays` decides, on this machine and the model's own weight shapes, whether to install it.
Without autograd (validation, decoding: a few rows a call, where each oneDNN call's own cost weighs), under
autocast, on another device or dtype, and inside a compiled graph it is ``nn.Linear``.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def onednn_product(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x W^T (+ b)`` by oneDNN: x [M, K], weight [N, K], bias [N] -> [M, N]."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight.contiguous(), bias, "none", [], "")


class _OneDNNLinearFunction(torch.autograd.Function):
    """``y = x W^T + b`` with x [M, K], W [N, K]; backward ``dx = dy W``, ``dW = dy^T x``, ``db = sum_rows dy``,
    each product by oneDNN."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return onednn_product(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = onednn_product(grad, weight.t()) if ctx.needs_input_grad[0] else None
        grad_weight = onednn_product(grad.t(), x.t()) if ctx.needs_input_grad[1] else None
        grad_bias = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


def onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)`` (x [..., K], weight [N, K]) whose fp32 products on the CPU, forward and
    backward, are oneDNN's while autograd records; elsewhere (no autograd, autocast, another device or dtype, a
    compiled graph) ``F.linear`` itself."""
    if (not torch.is_grad_enabled() or not x.is_cpu or x.dtype != torch.float32
            or weight.dtype != torch.float32 or torch.is_autocast_enabled("cpu")
            or torch.compiler.is_compiling()):
        return F.linear(x, weight, bias)
    rows = x.reshape(-1, x.size(-1))
    return _OneDNNLinearFunction.apply(rows, weight, bias).view(*x.shape[:-1], weight.size(0))


class OneDNNLinear(nn.Linear):
    """``nn.Linear`` (the same parameters and state dict) computing :func:`onednn_linear`."""

    def forward(self, x: Tensor) -> Tensor:
        return onednn_linear(x, self.weight, self.bias)


def relinked(kind: type[nn.Linear], linear: nn.Linear) -> nn.Linear:
    """A ``kind`` layer (``nn.Linear`` or :class:`OneDNNLinear`) over ``linear``'s own parameters: an optimizer that
    holds them keeps training them."""
    layer = kind(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
    layer.weight, layer.bias = linear.weight, linear.bias
    return layer.train(linear.training)


def onednn_pays(weights: list[Tensor], rows: int = 1024, repeats: int = 3) -> bool:
    """Whether training products by oneDNN (``y = x W^T``, ``dx`` and ``dW``: :class:`_OneDNNLinearFunction`) beat
    PyTorch's (``F.linear`` and its backward) for ``weights`` ([N, K] each, fp32) at ``rows`` rows on this machine:
    the better of three timings of ``repeats`` rounds of every layer's forward and backward each way."""
    if not torch.backends.mkldnn.is_available():
        return False
    generator = torch.Generator().manual_seed(0)  # the caller's random stream is left as it was
    xs = [torch.randn(rows, w.size(1), generator=generator).requires_grad_() for w in weights]
    grads = [torch.randn(rows, w.size(0), generator=generator) for w in weights]
    weights = [w.detach().float().clone().requires_grad_() for w in weights]

    def best(linear) -> float:
        times = []
        for _ in range(4):  # the first a warm-up: oneDNN makes its kernel for each new shape
            start = time.perf_counter()
            for _ in range(repeats):
                for x, w, grad in zip(xs, weights, grads):
                    linear(x, w, None).backward(grad)
            times.append(time.perf_counter() - start)
        return min(times[1:])

    with torch.enable_grad():
        return best(_OneDNNLinearFunction.apply) < best(F.linear)
