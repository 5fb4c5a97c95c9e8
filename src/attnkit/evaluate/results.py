"""The results JSON every benchmark writes into ``bench/results/``: ``name``, ``metrics``, ``command``, ``git_commit``,
``torch``, ``versions``, ``machine`` and ``date``, plus what a benchmark adds (``systems``, ``ratios``)."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# the instruction sets that decide which precisions and kernels are fast on a CPU
SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile",
              "amx_bf16", "amx_int8")


def machine() -> dict:
    """The CPU model, its count of cores and its vector instruction sets (``SIMD_FLAGS`` it has), the platform."""
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu == (platform.processor() or platform.machine()):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu": cpu, "cpu_flags": [f for f in SIMD_FLAGS if f in flags],
            "platform": platform.platform(), "python": sys.version.split()[0]}


def versions() -> dict:
    import numpy
    import sacrebleu
    import torch

    import attnkit

    return {"torch": torch.__version__, "attnkit": attnkit.__version__, "sacrebleu": sacrebleu.__version__,
            "numpy": numpy.__version__}


def matmul_peak(threads: int, size: int = 2048, repeats: int = 5) -> float:
    """This machine's fp32 matmul peak: the best GFLOP/s of ``A @ B`` for square [size, size] matrices on
    ``threads`` threads (what benchmarks state their fractions of peak against)."""
    import time

    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * size**3 / best / 1e9


def write_results(path: str | Path, name: str, command: str, metrics: dict, **extra) -> Path:
    v = versions()
    record = {"name": name, "metrics": metrics, **extra, "command": command, "git_commit": git_commit(),
              "torch": v["torch"], "versions": v, "machine": machine(),
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def run_training(run_dir: str | Path) -> dict:
    """How a run trained, from its last checkpoint's record (``RUN/checkpoints/last/meta.json``): ``train_minutes``,
    ``steps``, ``epochs_completed`` and ``tokens_per_s`` (target tokens a second); {} where there is no such record
    (a checkpoint that is not in a run directory)."""
    from attnkit.checkpoint import read_meta

    last = Path(run_dir) / "checkpoints" / "last"
    if not (last / "meta.json").is_file():
        return {}
    p = read_meta(last)["progress"]
    return {"train_minutes": round(p["train_seconds"] / 60, 2), "steps": p["step"], "epochs_completed": p["epoch"],
            "tokens_per_s": round(p["train_tokens"] / max(p["train_seconds"], 1e-9), 1)}
