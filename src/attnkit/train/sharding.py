"""Fully sharded data parallel (FSDP; Zhao et al. 2023) on PyTorch's own engine, ``fully_shard``.

With ``train.parallel = "fsdp"`` each rank keeps 1/N of every parameter, gradient and Adam moment, and a
layer's full weights exist only while it runs: each encoder/decoder block is its own unit (gathered just
before its forward and backward, its gradients reduce-scattered right after), and the root holds the rest
(embeddings tied with the output projection). Updates equal DDP's: the same averaged gradient, sharded.

Checkpoints stay the files a single process writes: every rank takes part in gathering full tensors
(collectives, called in the same order on every rank), rank 0 writes them. So a run saved under FSDP resumes
under DDP or in one process, and the other way round.
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor, nn

# torch.distributed.fsdp (fully_shard, FSDPModule) and torch.distributed.tensor are imported where they are used:
# importing the training package must not need them (a torch built without distributed support still trains)


def shard(model: nn.Module) -> nn.Module:
    """Shard ``model`` in place over the default process group: every block of its layer lists, then the root."""
    from torch.distributed.fsdp import fully_shard

    for module in model.modules():
        if isinstance(module, nn.ModuleList):
            for block in module:
                fully_shard(block)
    fully_shard(model)
    return model


def is_sharded(model: nn.Module) -> bool:
    if "torch.distributed.fsdp" not in sys.modules:  # nothing was sharded in this process
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full(value: Tensor) -> Tensor:
    """The whole tensor behind a shard (a collective: every rank must call it), on the CPU."""
    if "torch.distributed.tensor" not in sys.modules:  # no DTensor was ever made
        return value.detach().cpu()
    from torch.distributed.tensor import DTensor

    return (value.full_tensor() if isinstance(value, DTensor) else value).detach().cpu()


def shard_like(value: Tensor, param: Tensor) -> Tensor:
    """A full tensor cut as ``param`` is (its own rank's piece, as a DTensor); others pass through."""
    if "torch.distributed.tensor" not in sys.modules:  # no DTensor was ever made
        return value
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(param, DTensor) and value.shape == param.shape:
        return distribute_tensor(value.to(param.device), param.device_mesh, param.placements, src_data_rank=None)
    return value


@torch.no_grad()
def copy_full_into(model: nn.Module, source: nn.Module) -> None:
    """Load the unsharded ``source``'s weights into the sharded ``model`` (the same architecture)."""
    theirs = dict(source.named_parameters())
    for name, param in model.named_parameters():
        param.copy_(shard_like(theirs[name].detach(), param))
    theirs = dict(source.named_buffers())
    for name, buf in model.named_buffers():
        buf.copy_(theirs[name])
