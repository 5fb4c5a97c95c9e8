"""Keep freed memory for reuse instead of handing it back to the operating system.

glibc serves every allocation above its mmap threshold (128 KiB, rising to at most 32 MiB) with a fresh
``mmap`` and unmaps it on free, so each such tensor pays a page fault per 4 KiB the first time it is
written. A training or decoding step allocates the same large shapes again and again ([tokens, vocab]
logits and their gradient, attention activations): measured on a 2-core EPYC, writing a fresh 36 MB tensor
took 15.8 ms against 1.1 ms for reused memory, and a Multi30k training step ran 1.14x faster with the
settings below. The price is that the process keeps the memory of its peak, which a training process
holds anyway.

The command line calls :func:`keep_freed_memory` at start; call it yourself when you drive attnkit from
Python. It changes nothing where the C library is not glibc (jemalloc, tcmalloc or macOS have their own
settings: jemalloc's ``MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1`` does the same, and the Makefile adds
``lg_extent_max_active_fit:10`` so that the kept memory is reused by bf16 training's varied requests).

:func:`bound_kernel_caches` bounds the caches of compiled oneDNN kernels, which a training process would fill
with kernels for shapes it never meets again.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_done = False


def keep_freed_memory(mmap_threshold: int = 1 << 30, trim_threshold: int = 1 << 30, top_pad: int = 64 << 20) -> bool:
    """Raise glibc's mmap and trim thresholds (bytes) for this process. -> whether glibc accepted them."""
    global _done
    if _done:
        return True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    _done = all(mallopt(param, value) == 1 for param, value in (
        (_M_MMAP_THRESHOLD, mmap_threshold), (_M_TRIM_THRESHOLD, trim_threshold), (_M_TOP_PAD, top_pad)))
    return _done


# oneDNN runs a CPU's bf16 and int8 matrix products, and its primitive cache and PyTorch's ideep cache on top of
# it keep up to 1,024 compiled kernels each, one per exact shape. Decoding meets the same shapes again (a search
# step per length and batch size): bounding the caches cost beam-5 bf16 decoding of 64 sentences about 15%,
# measured on an EPYC Zen 4. Training meets new shapes every batch (the number of tokens, the lengths), so the
# caches fill with kernels never used again: a bf16 Multi30k process grew by megabytes a step, and with both
# caches bounded it stayed flat and ran no slower (docs/performance.md).
KERNEL_CACHE_CAPACITY = 64
_KERNEL_CACHES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_kernel_caches(capacity: int = KERNEL_CACHE_CAPACITY) -> dict[str, str]:
    """Bound oneDNN's and ideep's caches of compiled kernels to ``capacity`` entries each, where the environment
    does not already set them. -> the settings in force.

    Both libraries read the variable when they first create a kernel, so this must run before the first bf16 or
    int8 product (or convolution) of the process: :class:`attnkit.train.Trainer` calls it when it starts."""
    for name in _KERNEL_CACHES:
        os.environ.setdefault(name, str(capacity))
    return {name: os.environ[name] for name in _KERNEL_CACHES}
