"""Ranks: the world a stage process lives in, read from torchrun's environment.

One process is a world of one. Under torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK` set), the
process group is started with gloo on CPU and nccl on GPU; only rank 0 talks to Dagster and
writes checkpoints. torch is imported by the functions that use it: a stage of one rank that does
not train (a data stage) never loads it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

if TYPE_CHECKING:
    import torch
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor


@dataclass(frozen=True, kw_only=True, slots=True)
class World:
    """This process's place among the ranks of a stage."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    gpus: int | None = None
    """GPUs per node the placement gives the stage (None: this machine's; see `factory.devices`)."""
    local_size: int = 1
    """Ranks on this node (torchrun's LOCAL_WORLD_SIZE)."""

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that reports, checkpoints and publishes."""
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        """This rank's device, by the one rule (`factory.devices.device_for`)."""
        from factory.devices import device_for

        return device_for(self.gpus, self.local_rank)


SINGLE = World()


def world_from_env(environ: Mapping[str, str] = os.environ, gpus: int | None = None) -> World:
    """The world torchrun describes in the environment (a world of one without torchrun), on the `gpus` per node its
    placement gives it."""
    size = int(environ.get("WORLD_SIZE", "1"))
    return World(rank=int(environ.get("RANK", "0")), size=size, local_rank=int(environ.get("LOCAL_RANK", "0")), gpus=gpus,
                 local_size=int(environ.get("LOCAL_WORLD_SIZE", str(size))))


def join(world: World, backend: str | None = None) -> None:
    """Start the process group of a world of several ranks (no-op for one, or when already started), over
    `backend_for(world, backend)`."""
    if world.size == 1:
        return
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = backend_for(world, backend)
        if world.device.type == "cuda":  # the rank's own GPU (the rule's), current for the collectives that allocate
            torch.cuda.set_device(world.device)
        dist.init_process_group(backend=backend, rank=world.rank, world_size=world.size)


def backend_for(world: World, asked: str | None) -> str:
    """The backend a world's ranks meet over: what the stage asks for, else nccl where every rank of the node has a GPU of
    its own and gloo otherwise. nccl asked for where ranks would share a GPU (fewer GPUs than ranks, or none: the ranks
    then compute on the CPU) becomes gloo, which takes CPU and CUDA tensors alike."""
    from factory.devices import gpus_used

    own_gpus = world.device.type == "cuda" and world.local_size <= gpus_used(world.gpus)
    if asked == "nccl" and not own_gpus:
        return "gloo"
    return asked or ("nccl" if own_gpus else "gloo")


def leave(world: World) -> None:
    """Tear the process group down."""
    if world.size == 1:
        return
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def broadcast(world: World, value: Any) -> Any:
    """Rank 0's `value`, on every rank."""
    if world.size == 1:
        return value
    import torch.distributed as dist

    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def gather(world: World, value: Any) -> list[Any]:
    """Every rank's `value`, in rank order, on every rank."""
    if world.size == 1:
        return [value]
    import torch.distributed as dist

    values: list[Any] = [None] * world.size
    dist.all_gather_object(values, value)
    return values


def summed_over_ranks(world: World, tensor: torch.Tensor) -> torch.Tensor:
    """The sum of a tensor over the ranks, where it lies (on GPUs nothing waits for it: read it when the number is needed)."""
    if world.size == 1:
        return tensor
    import torch.distributed as dist

    tensor = tensor.clone()
    dist.all_reduce(tensor)
    return tensor


def is_dtensor(value: object) -> TypeGuard[DTensor]:
    """Whether `value` is a DTensor (a shard under FSDP), without importing DTensor where nothing made one: its module costs
    0.7 s of imports (sympy's among them), which a process that loads the training code without training (the model
    stage) need not pay. (Building a torch optimizer imports torch._dynamo, and DTensor with it.)"""
    tensor = sys.modules.get("torch.distributed.tensor")
    return tensor is not None and isinstance(value, tensor.DTensor)


def is_fsdp(value: object) -> TypeGuard[FSDPModule]:
    """Whether FSDP2 shards the module `value`, without importing FSDP where nothing sharded one (`is_dtensor`)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(value, fsdp.FSDPModule)
