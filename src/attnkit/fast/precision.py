"""Decoding at lower precision: bf16 weights and activations, or int8 weights with int8 activations and integer
matrix products. Each is chosen by name (``fp32``, ``bf16``, ``int8``) and allowed only where this CPU has the
instructions that make it fast; elsewhere :func:`check_precision` refuses with one line naming what is missing,
rather than running a path tens of times slower than fp32.

* ``bf16``: a copy of the model in bfloat16 (AVX512_BF16 or AMX-BF16 on a CPU; any CUDA GPU with bf16). The
  models compute their log-probabilities in fp32 from the bf16 logits, so the search ranks in fp32.
* ``int8``: every ``nn.Linear`` of a copy of the model becomes an :class:`Int8Linear`: weights quantized once per
  output row, activations quantized per token at each call (the scale of each row of x), and the product of the
  two int8 matrices accumulated in int32 (``torch._int_mm``: oneDNN's VNNI or AMX kernels), then scaled back:

      y = (s_x s_w^T) * (round(x / s_x) @ round(W / s_w)^T) + b,   s_x = max_j |x_ij| / 127,  s_w = max_j |W_ij| / 127

  Needs AVX512_VNNI, AVX_VNNI or AMX-INT8 on a CPU.

The tests check each path equal to its own reference (:func:`int8_linear_reference`: the same rounding, in fp64)
and close to fp32; ``bench/decode_precision.py`` measures speed and BLEU per precision.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import torch
from torch import Tensor, nn

from attnkit.errors import AttnkitError

PRECISIONS = ("fp32", "bf16", "int8")
# how far int8 decoding's scores may be from fp32's, relative (an activation's rounding to one of 255 levels,
# compounded over the layers): the bound its tests hold it to, and the one its compiled steps are checked to
INT8_TOLERANCE = 0.05
NEEDS = {  # a CPU's flags (/proc/cpuinfo) any one of which makes the precision fast
    "bf16": ("avx512_bf16", "amx_bf16"),
    "int8": ("avx512_vnni", "avx_vnni", "amx_int8"),
}


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The instruction-set flags of this machine's CPU, as /proc/cpuinfo lists them (empty where it cannot be
    read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def check_precision(precision: str, device: str = "cpu", flags: frozenset[str] | None = None) -> None:
    """Refuse, in one line, a precision this machine cannot run fast (or that does not exist)."""
    if precision not in PRECISIONS:
        raise AttnkitError(f"precision: {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return
    if device != "cpu":
        if precision == "int8":
            raise AttnkitError("precision: int8 decoding runs on CPUs only (use bf16 on a GPU)")
        return
    flags = cpu_flags() if flags is None else flags
    if not any(f in flags for f in NEEDS[precision]):
        raise AttnkitError(f"precision: {precision} needs a CPU with {' or '.join(NEEDS[precision])} "
                           f"(this one has none of them: {precision} would run slower than fp32)")


def row_scales(x: Tensor) -> Tensor:
    """Each row's int8 scale: x [..., n] -> scale [..., 1] fp32, max |x_row| / 127 (a zero row gets scale 1)."""
    scale = x.detach().abs().amax(-1, keepdim=True).float() / 127.0
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric int8 quantization per row: x [..., n] -> (q [..., n] int8, scale [..., 1] fp32), x ~ q * scale,
    q = round(x / scale) (:func:`row_scales`)."""
    scale = row_scales(x)
    q = torch.round(x.float() / scale).clamp_(-127, 127).to(torch.int8)
    return q, scale


def int8_linear_reference(x: Tensor, q_weight: Tensor, w_scale: Tensor, bias: Tensor | None) -> Tensor:
    """:class:`Int8Linear`'s arithmetic in fp64 (exact for these integers): the reference its kernel is tested
    against. x [..., in], q_weight [out, in] int8, w_scale [out, 1] -> [..., out]."""
    q_x, x_scale = quantize_rows(x)
    out = (q_x.double() @ q_weight.double().t()) * (x_scale.double() * w_scale.double().view(-1))
    return (out if bias is None else out + bias.double()).to(x.dtype)


class Int8Linear(nn.Module):
    """``nn.Linear`` with int8 weights (per output row) and per-token int8 activations, the product in int32.

    ``weight`` stays readable (the dequantized int8 weights, fp32) for code that slices it, such as the
    attention's query and key/value thirds of ``in_proj``: those products use the same rounded weights in fp32."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q, scale = quantize_rows(linear.weight.detach())
        self.register_buffer("q_weight_t", q.t().contiguous())  # [in, out]: the layout the int32 product reads
        # [out, in], read (transposed) by the product of one row: oneDNN's matrix-vector product then ran the
        # Multi30k output projection (128 -> 6000) in 15.5 against 32.5 us, where from five rows on [in, out] was
        # as fast or faster (AMD EPYC Zen 4, one thread)
        self.register_buffer("q_weight", q)
        self.register_buffer("w_scale", scale.view(-1))  # [out]
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())
        # stored column-major, as compile.py stores nn.Linear's: a product with a slice of its rows (cross-attention's
        # queries) then hands BLAS a plain [in, out] matrix; int8 greedy decoding of 64 sentences ran 2.3% faster
        # (the Multi30k model, AMD EPYC Zen 5, where MKL's fp32 products take their AVX2 path)
        self.register_buffer("weight", (q.float() * scale).t().contiguous().t())
        self.register_buffer("unit_scale", torch.ones(self.out_features))  # the weight scale of _product_in_graph

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        rows = x.reshape(-1, self.in_features)
        if torch.compiler.is_exporting() and isinstance(rows.size(0), int):
            return self._product_in_graph(rows).view(*shape[:-1], self.out_features).to(x.dtype)
        q_x, x_scale = quantize_rows(rows)
        # one row: a size known to be 1 (eagerly, or in a graph whose sizes are fixed); a size that is a symbol of
        # a graph keeps the layout of many rows rather than have the graph guard on it
        one_row = isinstance(rows.size(0), int) and rows.size(0) == 1
        weight = self.q_weight.t() if one_row else self.q_weight_t
        # scaled one factor at a time: x_scale * w_scale would be a [rows, out] matrix of its own, which for the
        # output projection of 320 beams (aten::mul: 21% of eager int8 beam search of 64 sentences; torch.profiler)
        out = torch._int_mm(q_x, weight).float() * x_scale * self.w_scale
        if self.bias is not None:
            out = out + self.bias
        return out.view(*shape[:-1], self.out_features).to(x.dtype)

    def _product_in_graph(self, rows: Tensor) -> Tensor:
        """The same product, as a graph whose sizes are all fixed (a search of one sentence: attnkit.fast.aot's
        FIXED_GRAPH) computes it: oneDNN's quantized linear over the weight packed once, which Inductor lowers to a
        C++ GEMM of its own with VNNI (or AMX) instructions, inlined in the graph with the quantization around it,
        where ``torch._int_mm`` is a library call a layer. Its activations are unsigned, q + 128 with zero point 128
        (the instructions multiply unsigned by signed bytes), its scales 1: the integer sums, compensated for the zero
        point, are those of ``q_x @ q_w^T`` (exactly: in fp32 below 2^24), then scaled as in :meth:`forward`. One step
        of beam search of one sentence (Multi30k model, 5 rows) ran its output projection in 13.2 against 32.3 us,
        eight 128x128 layers in 14.4 against 20.7 us (AMD EPYC Zen 5). Batches keep ``torch._int_mm``: at 64 rows
        Inductor's GEMM of a 128x128 layer took twice as long."""
        scale = row_scales(rows)
        # q + 128 formed in fp32 (exact: integers up to 255) and converted to bytes once, which Inductor vectorizes;
        # through int16 (int8 -> int16 -> uint8) its conversion is a scalar loop
        unsigned = (torch.round(rows.float() / scale).clamp_(-127, 127) + 128).to(torch.uint8)
        packed = torch.ops.onednn.qlinear_prepack(self.q_weight, None)  # constant-folded when the graph is frozen
        sums = torch.ops.onednn.qlinear_pointwise.default(unsigned, 1.0, 128, packed, self.unit_scale, None, None, 1.0,
                                                          0, torch.float32, "none", [], "")
        out = sums * scale * self.w_scale
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def _register_fake_int8_packing() -> None:
    """Let ``torch.export`` trace ``onednn::qlinear_prepack``, which PyTorch gives no fake kernel (Inductor inserts
    it after tracing): the packed weight is opaque, [in, out] to the product's shape rule."""
    if not torch._C._dispatch_has_kernel_for_dispatch_key("onednn::qlinear_prepack", "Meta"):
        torch.library.register_fake("onednn::qlinear_prepack")(
            lambda weight, x_shape=None: weight.new_empty((weight.size(1), weight.size(0))))


def _to_int8(model: nn.Module) -> nn.Module:
    _register_fake_int8_packing()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, Int8Linear(child))
    return model


def at_precision(model: nn.Module, precision: str) -> nn.Module:
    """A copy of ``model`` (in eval mode) computing at ``precision`` (checked with :func:`check_precision`);
    ``fp32``: the model itself."""
    device = next(model.parameters()).device.type
    check_precision(precision, device)
    if precision == "fp32":
        return model
    out = copy.deepcopy(model).eval()
    for p in out.parameters():
        p.requires_grad_(False)
    if precision == "bf16":
        return out.to(torch.bfloat16)
    return _to_int8(out)


__all__ = ["INT8_TOLERANCE", "NEEDS", "PRECISIONS", "Int8Linear", "at_precision", "check_precision", "cpu_flags",
           "int8_linear_reference", "quantize_rows", "row_scales"]
