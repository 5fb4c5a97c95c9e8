"""MKL's kernels chosen by the CPU's instructions, not its vendor: fp32 products at AVX-512 speed on an AMD CPU.

PyTorch's fp32 matrix products on a CPU (``nn.Linear``, ``torch.mm``, ``bmm``) are Intel MKL's, linked into
libtorch. MKL chooses its kernels by asking first whether the CPU is Intel's: on an AMD CPU it runs its AVX2 code
even where the CPU has AVX-512. On one core of an AMD EPYC Zen 5 its products of the Multi30k model's training
shapes ran at about 105 GFLOP/s that way and about 250 with its AVX-512 kernels, without a copy for a transposed
operand, and a training step took three quarters of the time (docs/performance.md, "MKL's kernels on an AMD CPU").

MKL asks one function, ``mkl_serv_intel_cpu_true``, which libtorch exports and calls through its symbol table. A
library in the process's global symbol scope before libtorch that defines it to answer yes is the one MKL calls,
and MKL then picks its kernels by the CPU's own feature flags, as on an Intel CPU: it runs only instructions the CPU
has. attnkit builds that one-line library with the system's C compiler once, keeps it in its cache
(``$ATTNKIT_CACHE``, else ``$XDG_CACHE_HOME/attnkit``, else ``~/.cache/attnkit``), and loads it
(:func:`use_feature_kernels`) when all of these hold:

- the CPU is AMD's and has AVX-512 (``avx512f``): on an Intel CPU MKL already picks by features, and on an AMD CPU
  without AVX-512 its AVX2 code is what the CPU has;
- torch is not imported yet: once libtorch is loaded, its calls are bound to its own answer;
- ``ATTNKIT_MKL`` is ``features`` (the default); ``vendor`` leaves MKL's own choice.

Importing attnkit does not do it: a library that changes how MKL picks kernels changes the whole process, so it is
asked for. The ``attnkit`` command line asks as it starts, :func:`attnkit.load` when it is called before torch is
imported, and the benches as they start; Python code asks with ``attnkit.mkl.use_feature_kernels()`` before it
imports torch. :func:`kernels` says which MKL runs, and every results JSON records it. Without a C compiler nothing
is loaded and MKL chooses as it does by default.

This module imports nothing heavy: it runs before torch is loaded.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from attnkit.errors import environment_choice
from attnkit.native import build, cache_root

CHOICES = ("features", "vendor")
SOURCE = "int mkl_serv_intel_cpu_true(void) { return 1; }\n"
# MKL's code branches (mkl_cbwr.h), as mkl_serv_cbwr_get_auto_branch names the one it dispatches to
BRANCHES = {2: "chosen per call (MKL's path for a CPU it does not know)", 3: "compatible", 4: "SSE2", 6: "SSSE3",
            7: "SSE4.1", 8: "SSE4.2", 9: "AVX", 10: "AVX2", 11: "AVX-512 (Xeon Phi)", 12: "AVX-512",
            13: "AVX-512 (Xeon Phi, E1)", 14: "AVX-512 (E1: with VNNI)"}

_loaded: str | None = None  # the library use_feature_kernels loaded, if any


class MklChoiceError(ValueError):
    """``ATTNKIT_MKL`` names no choice attnkit knows."""


def choice(environ: Mapping[str, str]) -> str:
    """What ``ATTNKIT_MKL`` asks for: "features" (the default) or "vendor"."""
    return environment_choice(environ, "ATTNKIT_MKL", CHOICES, MklChoiceError)


def amd_with_avx512(cpuinfo: str) -> bool:
    """Whether ``cpuinfo`` (``/proc/cpuinfo``) describes an AMD CPU ("AuthenticAMD") with AVX-512 (``avx512f``)."""
    vendor = flags = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = value
    return vendor == "AuthenticAMD" and "avx512f" in flags.split()


def applies(environ: Mapping[str, str], cpuinfo: str, torch_imported: bool) -> bool:
    """Whether the library should be loaded: see the module's text."""
    return choice(environ) == "features" and not torch_imported and amd_with_avx512(cpuinfo)


def build_library(directory: Path) -> Path | None:
    """The library defining ``mkl_serv_intel_cpu_true`` to answer yes, built once into ``directory`` with the
    system's C compiler (:func:`attnkit.native.build`); None where there is no compiler or it fails."""
    return build(SOURCE, "mkl_features", directory)


def use_feature_kernels(environ: Mapping[str, str] | None = None) -> str | None:
    """Load the library (see the module's text) where that applies; the path loaded, else None. Call it before
    torch is imported; a second call does nothing."""
    global _loaded
    environ = os.environ if environ is None else environ
    if _loaded is not None:
        return _loaded
    try:
        with open("/proc/cpuinfo") as f:
            cpuinfo = f.read()
    except OSError:
        return None
    if not applies(environ, cpuinfo, "torch" in sys.modules):
        return None
    path = build_library(cache_root(environ) / "mkl")
    if path is None:
        return None
    try:
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return None
    _loaded = str(path)
    return _loaded


def kernels() -> str:
    """The code branch MKL dispatches this process's products to ("AVX-512 (E1: with VNNI)", "AVX2", ...), as MKL
    itself reports it; "unknown" where torch has no MKL to ask. Imports torch."""
    import torch

    library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        branch = ctypes.CDLL(str(library)).mkl_serv_cbwr_get_auto_branch()
    except (OSError, AttributeError):
        return "unknown"
    return BRANCHES.get(branch, f"branch {branch}")
