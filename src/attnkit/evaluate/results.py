"""The results JSON every benchmark writes into ``bench/results/``: ``name``, ``metrics``, ``command``, ``git_commit``,
``dirty``, ``torch``, ``versions``, ``machine`` and ``date``, plus what a benchmark adds (``systems``, ``ratios``)."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

# what the benches and recipes write as they run, not code: changes there leave the code measured as committed
# (a bench run after another finds the first one's JSON changed)
OUTPUTS = ("runs/", "bench/results/")


def git_head(cwd: str | Path | None = None) -> str | None:
    """The commit checked out in the repository at ``cwd`` (default: this process's directory); None outside one."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=cwd).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def uncommitted_changes(cwd: str | Path | None = None) -> list[str] | None:
    """The paths ``git status --porcelain`` lists in the working tree at ``cwd`` (changed, staged, deleted or
    untracked, outside ``.gitignore``), less the benches' and runs' own output (:data:`OUTPUTS`); None outside a
    repository."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], capture_output=True,
                             text=True, check=True, cwd=cwd).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    paths = [line[3:].split(" -> ")[-1].strip('"') for line in out.splitlines() if line.strip()]
    return [p for p in paths if not p.startswith(OUTPUTS)]


def working_tree_dirty(cwd: str | Path | None = None) -> bool | None:
    """Whether the code that runs differs from its commit: any uncommitted change but the output
    (:func:`uncommitted_changes`); None outside a repository."""
    changes = uncommitted_changes(cwd)
    return None if changes is None else bool(changes)


def git_commit() -> str:
    """The commit, with "-dirty" where the working tree has uncommitted changes (:func:`working_tree_dirty`);
    "unknown" outside a repository."""
    head = git_head()
    return "unknown" if head is None else head + ("-dirty" if working_tree_dirty() else "")


# the instruction sets that decide which precisions and kernels are fast on a CPU
SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile",
              "amx_bf16", "amx_int8")


def machine() -> dict:
    """The CPU model, its count of cores and its vector instruction sets (``SIMD_FLAGS`` it has), the platform.

    Under a hypervisor the model name can be as bare as "AMD EPYC" for several generations, so the CPU's family
    and model numbers (``cpu family`` and ``model`` in /proc/cpuinfo) are kept too: they tell the generations
    apart (AMD family 25 is Zen 3 and Zen 4, family 26 Zen 5)."""
    cpu, flags, numbers = platform.processor() or platform.machine(), set(), {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "model name" and cpu == (platform.processor() or platform.machine()):
                cpu = value
            elif key == "flags" and not flags:
                flags = set(value.split())
            elif key in ("cpu family", "model") and value.isdigit():
                numbers.setdefault("cpu_" + key.split()[-1], int(value))
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu": cpu, **numbers, "cpu_flags": [f for f in SIMD_FLAGS if f in flags],
            "platform": platform.platform(), "python": sys.version.split()[0]}


def versions() -> dict:
    import numpy
    import sacrebleu
    import torch

    import attnkit

    return {"torch": torch.__version__, "attnkit": attnkit.__version__, "sacrebleu": sacrebleu.__version__,
            "numpy": numpy.__version__}


def matmul_peak(threads: int, size: int = 2048, repeats: int = 5) -> float:
    """This machine's fp32 matmul peak: the best GFLOP/s of a product of square [size, size] matrices on
    ``threads`` threads, by either library PyTorch has for it (what benchmarks state their fractions of peak
    against): ``A @ B`` (MKL), and oneDNN's product with B packed once. On an AMD CPU MKL left to itself runs its AVX2
    code (:mod:`attnkit.mkl`); on a Zen 5 core, whose 512-bit vectors run at full width, oneDNN's then reached about
    twice its rate."""
    import time

    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    products = [lambda: a @ b]
    if torch.backends.mkldnn.is_available():
        packed = torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous(), None)
        products.append(lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], ""))
    best = float("inf")
    for product in products:
        product()  # warm-up
        for _ in range(repeats):
            t = time.perf_counter()
            product()
            best = min(best, time.perf_counter() - t)
    return 2 * size**3 / best / 1e9


def write_results(path: str | Path, name: str, command: str, metrics: dict, **extra) -> Path:
    """Write a bench's results JSON atomically, with what it ran on: the command, the commit and whether the working
    tree had uncommitted changes (``dirty``: true, false, or null outside a repository), the versions, the machine,
    the allocator (this process's, or ``allocator=`` where the bench timed other processes) and the code branch of
    MKL's kernels (:func:`attnkit.mkl.kernels`, this process's, or ``mkl_kernels=``)."""
    from attnkit import allocator, mkl

    # the settings of the environment that change what a bench measures, written as the command's prefix
    settings = [f"{k}={os.environ[k]}" for k in ("ATTNKIT_MKL", "ATTNKIT_ALLOCATOR", "ATEN_CPU_CAPABILITY",
                                                  "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
                if os.environ.get(k) and f"{k}=" not in command]
    command = " ".join([*settings, command])
    v = versions()
    ran_on = extra.pop("allocator", None) or allocator.current()
    kernels = extra.pop("mkl_kernels", None) or mkl.kernels()
    # the commit, and beside it whether the working tree had changes it does not hold: a reader reruns the commit
    record = {"name": name, "metrics": metrics, **extra, "command": command, "git_commit": git_head() or "unknown",
              "dirty": working_tree_dirty(),
              "torch": v["torch"], "versions": v, "machine": machine(), "allocator": ran_on, "mkl_kernels": kernels,
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
