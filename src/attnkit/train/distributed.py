"""PyTorch's own distributed engine: torchrun sets the environment, we join the process group.

gloo on CPU, NCCL on CUDA. Rank 0 validates, logs and writes checkpoints; the other ranks
wait at a barrier. Every collective here is called by all ranks in the same order.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def setup() -> tuple[int, int]:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1); returns (rank, world size)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_sum(value: float, world: int) -> float:
    if world == 1:
        return value
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item())


def any_true(flag: bool, world: int) -> bool:
    """True on every rank if it is True on any: all ranks stop together."""
    return all_sum(1.0 if flag else 0.0, world) > 0


def barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def gather_rng(world: int) -> list[torch.Tensor]:
    """Every rank's torch RNG state (dropout differs per rank), collected on all ranks."""
    state = torch.get_rng_state()
    if world == 1:
        return [state]
    out = [torch.empty_like(state) for _ in range(world)]
    dist.all_gather(out, state)
    return out
