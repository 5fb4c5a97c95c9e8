"""PyTorch's own distributed engine: torchrun sets the environment, we join the process group.

gloo on CPU, NCCL on CUDA. Rank 0 validates, logs and writes checkpoints; the other ranks
wait at a barrier. Every collective here is called by all ranks in the same order.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn

import torch
import torch.distributed as dist

from attnkit.errors import AttnkitError

_device = torch.device("cpu")  # where this process's collectives run: NCCL takes only CUDA tensors


def training_device(name: str) -> torch.device:
    """``train.device`` (auto | cpu | cuda) -> this process's device; under torchrun, GPU LOCAL_RANK."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise AttnkitError("train.device = 'cuda', but this machine has no CUDA device (use auto or cpu)")
    index = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(index)
    deterministic_cuda()
    return torch.device("cuda", index)


def deterministic_cuda() -> None:
    """Make CUDA's kernels deterministic, so that a resumed run repeats an uninterrupted one bit for bit as it does
    on a CPU: the embedding's backward (and any scatter-add) otherwise accumulates with atomics in whatever order
    the threads arrive, cuBLAS needs a fixed workspace (set before its first use), and the fused attention kernels
    take their deterministic backward only when determinism is demanded, not merely warned about."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


def setup(device: torch.device | None = None) -> tuple[int, int]:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1): NCCL for CUDA, gloo for the CPU.
    Returns (rank, world size)."""
    global _device
    world = int(os.environ.get("WORLD_SIZE", "1"))
    _device = device = device or torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        # torch.distributed.nn.functional's collectives take the default group as a default argument, read when the
        # module is imported (FSDP imports it): imported after the group exists, they would keep it alive past
        # :func:`leave`, and with it gloo's worker threads into the interpreter's shutdown
        import torch.distributed.nn.functional as _  # noqa: F401

        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        atexit.register(leave)
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def leave() -> None:
    """Leave the process group that :func:`setup` joined, at the process's exit while Python is still whole, so
    that the group's last reference can go and gloo join its worker threads. Something may still hold the group's
    backend, and its threads then live on: a command's rank ends by :func:`end_process`, without the interpreter's
    finalization, for that reason."""
    if dist.is_initialized():
        dist.destroy_process_group()


def joined() -> bool:
    """Whether this process is in a process group (:func:`setup` joined one, :func:`leave` has not left it)."""
    return dist.is_initialized()


def end_process(code: int) -> NoReturn:
    """End a rank's process with status ``code`` once its work is done: the exit handlers run (:func:`leave`
    among them) and the standard streams are flushed, then the process ends without the interpreter's
    finalization.

    Why: leaving the group does not stop gloo's worker threads while anything still holds the group's backend, and a
    worker that finishes a collective (a barrier holds the collectives before it) may then drop the last reference to
    a tensor that Python made, which needs the GIL. Once finalization has begun, CPython ends a thread that asks for
    the GIL with pthread_exit, whose unwinding through the worker's noexcept destructor (~AsyncBarrierWork) calls
    std::terminate: the rank would die by SIGABRT ("terminate called without an active exception") after its work
    was done. Without finalization no thread is asked to unwind; the files a rank wrote were closed before its
    command returned."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def all_sum(value: float, world: int) -> float:
    if world == 1:
        return value
    t = torch.tensor([float(value)], dtype=torch.float64, device=_device)
    dist.all_reduce(t)
    return float(t.item())


def any_true(flag: bool, world: int) -> bool:
    """True on every rank if it is True on any: all ranks stop together."""
    return all_sum(1.0 if flag else 0.0, world) > 0


def barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def gather_rng(world: int, cuda: bool = False) -> list[torch.Tensor]:
    """Every rank's torch RNG state (dropout differs per rank; with ``cuda``, its GPU's), collected on all ranks."""
    state = torch.cuda.get_rng_state() if cuda else torch.get_rng_state()
    if world == 1:
        return [state]
    state = state.to(_device)
    out = [torch.empty_like(state) for _ in range(world)]
    dist.all_gather(out, state)
    return [s.cpu() for s in out]
