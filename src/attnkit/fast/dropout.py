"""Dropout (Srivastava et al. 2014) with a cheaper random source on CPU: the fast runtime's ``"dropout16"``, which
replaces every ``nn.Dropout`` of a model (:func:`attnkit.fast.use`).

PyTorch's CPU dropout draws one Bernoulli sample per element from its Mersenne Twister, one after another: a small
Transformer's training step has 22 dropouts, and drawing their numbers one by one is a large share of its
non-matrix work.
Here each call takes one 64-bit key from torch's default generator, and element ``i`` gets the 16-bit uniform

    u_i = bits 16 (i mod 4) .. 16 (i mod 4) + 15 of  splitmix64(key + (i div 4 + 1) * 0x9E3779B97F4A7C15)

(Steele, Lea and Flood 2014: a counter hashed by a 64-bit finaliser, so every element's number is computed on its
own, in parallel lanes). An element is dropped when ``u_i < round(p 65536)``; the survivors are scaled by
``1 / (1 - p')`` with the rounded ``p' = round(p 65536) / 65536``, so the expectation is exactly the input. The
key comes from torch's generator, so ``torch.manual_seed`` and a checkpoint's saved RNG state reproduce the masks.

The masks are made by a C kernel attnkit compiles once for this CPU (:mod:`attnkit.native`; for fp32 it also
multiplies, in one pass); :func:`uniforms` computes the same numbers with NumPy, and is what runs where there is no
C compiler, bit for bit the same masks. On a [1500, 256] fp32 activation the kernel's forward took about a sixth of
the time of 16-bit uniforms cut from torch's own 64-bit draws, on one core of an AMD EPYC Zen 5
(docs/performance.md). On other devices this is ``F.dropout``, whose kernels are fused there.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.fast.precision import cpu_flags
from attnkit.native import build, cache_root

_LEVELS = 1 << 16
_GOLDEN = 0x9E3779B97F4A7C15

SOURCE = r"""
#include <stdint.h>
#include <string.h>

static inline uint64_t splitmix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

#define CHUNK 1024  /* elements per pass: the chunk's hashes stay in L1 */

/* The uniforms of elements start .. start + len - 1 (start a multiple of 4) into u. */
static void uniforms(uint16_t *restrict u, int64_t start, int64_t len, uint64_t key) {
    uint64_t z[CHUNK / 4];
    int64_t first = start / 4, blocks = (len + 3) / 4;
    for (int64_t j = 0; j < blocks; j++)
        z[j] = splitmix64(key + (uint64_t)(first + j + 1) * 0x9E3779B97F4A7C15ULL);
    memcpy(u, z, (size_t)len * sizeof(uint16_t));  /* little-endian: element 4j + k is bits 16k .. 16k + 15 of z[j] */
}

/* y = x * mask, mask[i] = keep if u_i >= drop else 0 (fp32) */
void dropout_f32(float *restrict y, float *restrict mask, const float *restrict x, int64_t n, uint64_t key,
                 uint32_t drop, float keep) {
    uint16_t u[CHUNK];
    for (int64_t start = 0; start < n; start += CHUNK) {
        int64_t len = n - start < CHUNK ? n - start : CHUNK;
        uniforms(u, start, len, key);
        for (int64_t i = 0; i < len; i++) {
            float m = u[i] >= drop ? keep : 0.0f;
            mask[start + i] = m;
            y[start + i] = x[start + i] * m;
        }
    }
}

/* mask[i] = keep if u_i >= drop else 0, for any 16-bit float type given by its bits (bf16, fp16) */
void dropout_mask16(uint16_t *restrict mask, int64_t n, uint64_t key, uint32_t drop, uint16_t keep) {
    uint16_t u[CHUNK];
    for (int64_t start = 0; start < n; start += CHUNK) {
        int64_t len = n - start < CHUNK ? n - start : CHUNK;
        uniforms(u, start, len, key);
        for (int64_t i = 0; i < len; i++)
            mask[start + i] = u[i] >= drop ? keep : (uint16_t)0;
    }
}
"""


@functools.cache
def kernels() -> ctypes.CDLL | None:
    """The compiled mask kernels (built on first use, for this CPU), or None where no C compiler builds them."""
    path = build(SOURCE, "dropout", cache_root(os.environ) / "kernels", ("-O3", "-march=native"),
                 key=" ".join(sorted(cpu_flags())))
    if path is None:
        return None
    try:
        library = ctypes.CDLL(str(path))
    except OSError:
        return None
    library.dropout_f32.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                    ctypes.c_uint64, ctypes.c_uint32, ctypes.c_float]
    library.dropout_mask16.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64, ctypes.c_uint32,
                                       ctypes.c_uint16]
    return library


def uniforms(n: int, key: int) -> np.ndarray:
    """The 16-bit uniforms u_0 .. u_{n-1} of ``key`` (the module's formula) -> uint16 [n]."""
    z = np.arange(1, (n + 3) // 4 + 1, dtype=np.uint64)  # in place from here: integer products wrap mod 2^64
    z *= np.uint64(_GOLDEN)
    z += np.uint64(key)
    shifted = np.empty_like(z)
    for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, 1)):
        np.right_shift(z, np.uint64(shift), out=shifted)
        z ^= shifted
        if factor != 1:
            z *= np.uint64(factor)
    return z.astype("<u8", copy=False).view("<u2")[:n]


def draw_key() -> int:
    """One 64-bit key from torch's default generator (what every call of the dropout takes from it)."""
    return int(torch.empty((), dtype=torch.int64).random_(-(1 << 63), None)) & ((1 << 64) - 1)


def dropout_mask(x: Tensor, drop_levels: int, key: int, native: bool = True) -> tuple[Tensor, Tensor]:
    """(x * mask, mask) for the uniforms of ``key``: mask is 0 where u_i < ``drop_levels`` and 1 / (1 - p')
    (rounded to x's dtype) elsewhere; x on the CPU, contiguous. ``native``: the C kernel where it is built, else
    NumPy's numbers, which are the same."""
    keep = torch.tensor(_LEVELS / (_LEVELS - drop_levels), dtype=x.dtype)
    library = kernels() if native and sys.byteorder == "little" else None  # the kernel reads hashes as 16-bit words
    n = x.numel()
    if library is not None and x.dtype == torch.float32:
        y, mask = torch.empty_like(x), torch.empty_like(x)
        library.dropout_f32(y.data_ptr(), mask.data_ptr(), x.data_ptr(), n, key, drop_levels, float(keep))
        return y, mask
    if library is not None and x.element_size() == 2:
        mask = torch.empty_like(x)
        library.dropout_mask16(mask.data_ptr(), n, key, drop_levels, int(keep.view(torch.int16)) & 0xFFFF)
        return x * mask, mask
    kept = torch.from_numpy(uniforms(n, key) >= drop_levels).view(x.shape)
    mask = kept.to(x.dtype).mul_(keep)
    return x * mask, mask


class _CpuDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:
        y, mask = dropout_mask(x.contiguous(), round(p * _LEVELS), draw_key())
        ctx.save_for_backward(mask)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor):
        (mask,) = ctx.saved_tensors
        return grad * mask, None


def dropout16(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)``; identity unless training."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if round(p * _LEVELS) == _LEVELS:  # p = 1, or within 1/65536 of it
        return x * 0.0
    if x.device.type != "cpu" or not x.is_floating_point():
        return F.dropout(x, p, True)
    return _CpuDropout.apply(x, p)


class Dropout16(nn.Module):
    """``nn.Dropout`` with the cheaper CPU random source of :func:`dropout16`; any shape in, same shape out."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout16(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
