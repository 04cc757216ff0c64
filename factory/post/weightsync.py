"""Weight sync: the learners of an RL stage push their policy's weights to its actors.

An RL stage is one process world of L learners (ranks 0..L-1, training together under DDP, so
all holding the same weights) and A actors (ranks L..L+A-1, generating rollouts with a copy).
Every parameter belongs to one learner's shard, the shards balanced by bytes, and each learner
broadcasts only its shard, so the sending is spread over the L learners whatever A is. A shard
travels as one flat byte buffer: tensors of any dtype arrive bit for bit.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

HEADER_BYTES = 8
"""Each buffer opens with the pushed version, an int64."""
ALIGN_BYTES = 16
"""Tensors start at multiples of this in a buffer, so a slice can be viewed as any dtype."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Roles:
    """Which ranks learn and which act, and which of them this process is."""

    learners: int
    """Ranks 0..learners-1 train the policy; at least one."""
    actors: int
    """Ranks learners..learners+actors-1 generate with a copy of it; 0 when the learners generate themselves."""
    rank: int
    """This process's rank in the world."""

    def __post_init__(self) -> None:
        if self.learners < 1:
            raise ValueError(f"an RL stage needs at least 1 learner, got learners={self.learners}")
        if self.actors < 0:
            raise ValueError(f"actors must be 0 or more, got actors={self.actors}")
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} is outside a world of {self.learners} learners + {self.actors} actors "
                             f"(ranks 0..{self.size - 1})")

    @property
    def is_learner(self) -> bool:
        """This rank trains the policy."""
        return self.rank < self.learners

    @property
    def is_actor(self) -> bool:
        """This rank generates rollouts with pushed weights."""
        return self.rank >= self.learners

    @property
    def size(self) -> int:
        """Ranks in the world: learners + actors."""
        return self.learners + self.actors


def roles_from(world_rank: int, learners: int, actors: int) -> Roles:
    """The roles of rank `world_rank` in a world of `learners` then `actors` (ValueError when they do not fit)."""
    return Roles(learners=learners, actors=actors, rank=world_rank)


@dataclass(frozen=True, kw_only=True, slots=True)
class SyncStats:
    """What one push cost this rank."""

    seconds: float
    """Wall time of the push on this rank."""
    bytes: int
    """Bytes this rank sent (a learner) or received (an actor): whole buffers, version header and alignment included."""
    version: int
    """The version the weights now held by the actors carry (an actor: the one it received)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Slot:
    """Where one tensor lies in its learner's buffer."""

    name: str
    offset: int
    shape: torch.Size
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        """Bytes the tensor takes."""
        return self.shape.numel() * self.dtype.itemsize


def assign_shards(sizes: Mapping[str, int], learners: int) -> tuple[tuple[str, ...], ...]:
    """Names split into `learners` shards of about equal bytes: largest first to the least-loaded learner, ties by name then index."""
    if learners < 1:
        raise ValueError(f"need at least 1 learner to assign shards to, got {learners}")
    shards: list[list[str]] = [[] for _ in range(learners)]
    loads = [0] * learners
    for name, size in sorted(sizes.items(), key=lambda item: (-item[1], item[0])):
        least = min(range(learners), key=lambda i: (loads[i], i))
        shards[least].append(name)
        loads[least] += size
    return tuple(tuple(shard) for shard in shards)


def lay_out(shard: Sequence[str], tensors: Mapping[str, torch.Tensor]) -> tuple[tuple[Slot, ...], int]:
    """The slots of a shard's tensors after the header, and the buffer's length in bytes."""
    slots, offset = [], HEADER_BYTES
    for name in shard:
        offset = -(-offset // ALIGN_BYTES) * ALIGN_BYTES
        tensor = tensors[name]
        slots.append(Slot(name=name, offset=offset, shape=tensor.shape, dtype=tensor.dtype))
        offset += slots[-1].nbytes
    return tuple(slots), offset


class WeightSync:
    """Pushes the learners' weights to the actors.

    Must be constructed on every rank of the world, in the same order (it creates process groups).
    """

    def __init__(self, roles: Roles, parameters: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Plan the shards of `parameters` (names as `model.named_parameters()` gives them) and create the groups."""
        tensors = dict(parameters)
        if len(tensors) != len(parameters):
            raise ValueError("parameter names repeat; pass each tensor once (named_parameters() already drops tied ones)")
        self.roles = roles
        self.shards = assign_shards({name: t.numel() * t.element_size() for name, t in tensors.items()}, roles.learners)
        self.layouts = tuple(lay_out(shard, tensors) for shard in self.shards)
        self.learner_group: dist.ProcessGroup | None = None
        """Ranks 0..L-1, for DDP's process_group; None in a world of one without torch.distributed."""
        self._senders: tuple[dist.ProcessGroup | None, ...] = ()
        if roles.size == 1 and not dist.is_initialized():
            return
        if not dist.is_initialized():
            raise RuntimeError(f"a world of {roles.learners} learners + {roles.actors} actors needs torch.distributed "
                               "initialised before WeightSync")
        if (dist.get_world_size(), dist.get_rank()) != (roles.size, roles.rank):
            raise ValueError(f"roles say rank {roles.rank} of {roles.size}, torch.distributed says rank "
                             f"{dist.get_rank()} of {dist.get_world_size()}")
        # new_group is collective over the whole world: every rank creates every group, in this order.
        self.learner_group = dist.new_group(list(range(roles.learners)))
        if roles.actors:
            actors = list(range(roles.learners, roles.size))
            self._senders = tuple(dist.new_group([learner, *actors]) for learner in range(roles.learners))

    def push(self, model: nn.Module, version: int) -> SyncStats:
        """Copy the learners' weights into every actor's `model`; called on every rank at the same point.

        A learner sends its shard of `model`'s weights tagged with `version`; an actor overwrites its
        `model`'s tensors and ignores its own `version` argument, returning the one it received.
        """
        if not self.roles.actors:
            return SyncStats(seconds=0.0, bytes=0, version=version)
        started = time.perf_counter()
        model = model.module if isinstance(model, DistributedDataParallel) else model
        tensors = self._tensors_of(model)
        device = next(model.parameters()).device  # the backend's: nccl needs the buffers on the GPU
        if self.roles.is_learner:
            sent = self._send(tensors, version, device)
            return SyncStats(seconds=time.perf_counter() - started, bytes=sent.numel(), version=version)
        buffers = self._receive(device)
        versions = {int(buffer[:HEADER_BYTES].view(torch.int64).item()) for buffer in buffers}
        if len(versions) != 1:
            raise RuntimeError(f"learners pushed different versions {sorted(versions)}: they are out of step")
        with torch.no_grad():
            for buffer, (slots, _) in zip(buffers, self.layouts, strict=True):
                for slot in slots:
                    tensors[slot.name].copy_(_view(buffer, slot))
        received = sum(buffer.numel() for buffer in buffers)
        return SyncStats(seconds=time.perf_counter() - started, bytes=received, version=versions.pop())

    def _send(self, tensors: Mapping[str, torch.Tensor], version: int, device: torch.device) -> torch.Tensor:
        learner = self.roles.rank
        slots, length = self.layouts[learner]
        buffer = torch.zeros(length, dtype=torch.uint8, device=device)
        buffer[:HEADER_BYTES].view(torch.int64).fill_(version)
        with torch.no_grad():
            for slot in slots:
                _view(buffer, slot).copy_(tensors[slot.name])
        dist.broadcast(buffer, src=learner, group=self._senders[learner])  # src is the global rank
        return buffer

    def _receive(self, device: torch.device) -> list[torch.Tensor]:
        # All receives in flight at once: each learner's group carries its shard in parallel.
        buffers = [torch.empty(length, dtype=torch.uint8, device=device) for _, length in self.layouts]
        works = [dist.broadcast(buffer, src=learner, group=group, async_op=True)
                 for learner, (buffer, group) in enumerate(zip(buffers, self._senders, strict=True))]
        for work in works:
            work.wait()
        return buffers

    def _tensors_of(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """This rank's tensors to send or overwrite, checked against the plan."""
        named = dict(model.named_parameters()) | dict(model.named_buffers())
        shards = (self.roles.rank,) if self.roles.is_learner else range(self.roles.learners)
        tensors = {}
        for slot in (slot for learner in shards for slot in self.layouts[learner][0]):
            tensor = named.get(slot.name)
            if tensor is None:
                raise ValueError(f"the model has no parameter or buffer {slot.name!r} that WeightSync was planned with")
            if (tensor.shape, tensor.dtype) != (slot.shape, slot.dtype):
                raise ValueError(f"{slot.name!r} is {tuple(tensor.shape)} {tensor.dtype} in the model but was planned as "
                                 f"{tuple(slot.shape)} {slot.dtype}")
            tensors[slot.name] = tensor
        return tensors


def _view(buffer: torch.Tensor, slot: Slot) -> torch.Tensor:
    """The bytes of `slot` in `buffer`, seen as its tensor (a view: writing to it writes the buffer)."""
    return buffer[slot.offset:slot.offset + slot.nbytes].view(slot.dtype).view(slot.shape)
