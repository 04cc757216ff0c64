"""A model for FSDP that no rank ever holds whole: built on the meta device, sharded, then filled shard by shard with
exactly the bytes `build_model` gives.

An architecture initialises its weights in its constructor, drawing from the seeded global generator in an order of its
own (construction, then `apply`, then per-layer fixes). So the model is built by `build_model` itself, with two changes:
each parameter moves to the meta device as it is registered (this rank keeps its rows of the value it was created
with), and every write into a parameter (an `nn.init` function, a fill, a random draw) runs on a full-size scratch
tensor on the CPU instead, so the generator advances exactly as in an ordinary build, and this rank keeps only its rows
of the result. One parameter is whole at a time. After `fully_shard`, `to_empty` allocates the shards and the kept rows
are copied in; buffers (the rotary tables) are computed on the CPU as usual and put back after it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.overrides import TorchFunctionMode

from factory.config.schema import ModelConfig
from factory.errors import ConfigError
from factory.models.build import build_model

OVERWRITES = frozenset({"normal_", "uniform_", "zero_", "fill_", "copy_", "bernoulli_", "exponential_", "log_normal_", "cauchy_",
                        "geometric_", "random_"})
"""In-place tensor methods whose result does not depend on the values they overwrite."""
NOT_WRITES = frozenset({"requires_grad_", "share_memory_", "retain_grad"})


def rows_of(value: torch.Tensor, rank: int, ranks: int) -> torch.Tensor:
    """This rank's rows of a full tensor as FSDP2 shards it along the first dimension (`torch.chunk`: the last ranks may
    get fewer rows, or none); a scalar is kept whole."""
    if value.dim() == 0:
        return value.detach().clone()
    per = math.ceil(value.size(0) / ranks)
    start = min(rank * per, value.size(0))
    return value.detach()[start : min(start + per, value.size(0))].clone()


class ShardedBuild(TorchFunctionMode):
    """Active while the architecture builds: parameters go to the meta device, their writes to a scratch tensor."""

    def __init__(self, rank: int, ranks: int, arch: str) -> None:
        super().__init__()
        self.rank, self.ranks, self.arch = rank, ranks, arch
        self.rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        """id of a meta parameter -> (the parameter, this rank's rows of its value); the parameter is held so ids stay unique."""
        self._open: tuple[torch.Tensor, torch.Tensor] | None = None
        """The parameter being written and its whole value: later in-place writes to it (a truncation) apply there."""

    def register(self, module: nn.Module, name: str, param: nn.Parameter | None) -> nn.Parameter | None:
        """The parameter registration hook: a meta parameter in place of the real one, whose rows are kept."""
        if param is None or param.device.type == "meta":
            return None
        meta = nn.Parameter(torch.empty_like(param, device="meta"), requires_grad=param.requires_grad)
        self._close()
        self.rows[id(meta)] = (meta, rows_of(param, self.rank, self.ranks))
        return meta

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        target = args[0] if args else kwargs.get("tensor")
        if not isinstance(target, torch.Tensor) or target.device.type != "meta" or not _writes(func, name):
            return func(*args, **kwargs)
        if id(target) not in self.rows:
            raise ConfigError(f"architecture {self.arch!r} writes a tensor on the meta device that is not one of its parameters "
                              f"({name}, a `.data` of one?), so FSDP cannot initialise it shard by shard: use parallelism: ddp")
        whole = self._open[1] if self._open is not None and self._open[0] is target else None
        if whole is None:
            if getattr(func, "__module__", None) != "torch.nn.init" and name not in OVERWRITES:
                raise ConfigError(f"architecture {self.arch!r} initialises a parameter with {name}, which reads values written "
                                  "before, so FSDP cannot initialise it shard by shard: use parallelism: ddp")
            self._close()
            whole = torch.empty(target.shape, dtype=target.dtype)
            self._open = (target, whole)
        swap = (lambda value: whole if value is target else value)
        func(*(swap(a) for a in args), **{key: swap(value) for key, value in kwargs.items()})
        return target

    def _close(self) -> None:
        """Keep this rank's rows of the parameter last written, and let its whole value go."""
        if self._open is not None:
            target, whole = self._open
            self.rows[id(target)] = (target, rows_of(whole, self.rank, self.ranks))
            self._open = None

    def values(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """This rank's rows of every parameter of the built model, by name (tied names share theirs)."""
        self._close()
        return {name: self.rows[id(param)][1] for name, param in model.named_parameters(remove_duplicate=False)}


def _writes(func: Callable[..., Any], name: str) -> bool:
    """Whether `func` writes into its first argument."""
    if getattr(func, "__module__", None) == "torch.nn.init":
        return True
    if name in NOT_WRITES:
        return False
    return name == "__setitem__" or name.startswith("__i") or (name.endswith("_") and not name.startswith("__"))


@contextlib.contextmanager
def sharded_build(rank: int, ranks: int, arch: str) -> Iterator[ShardedBuild]:
    """Modules built in this block get meta parameters; the `ShardedBuild` yielded keeps this rank's rows of their values."""
    build = ShardedBuild(rank, ranks, arch)
    hook = nn.modules.module.register_module_parameter_registration_hook(build.register)
    try:
        with build:
            yield build
    finally:
        hook.remove()


def build_on_meta(config: ModelConfig, vocab_size: int, seed: int, rank: int, ranks: int) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """`build_model`'s model with its parameters on the meta device, and this rank's rows of each parameter's value."""
    with sharded_build(rank, ranks, config.arch) as build:
        model = build_model(config, vocab_size, seed)
    return model, build.values(model)


def materialise(model: nn.Module, rows: dict[str, torch.Tensor], device: torch.device) -> None:
    """Allocate a sharded meta model's shards on `device` and fill them with this rank's `rows`; its buffers keep their
    values. Tied parameters stay tied."""
    buffers = {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, param in model.named_parameters(remove_duplicate=False):
            local = param.to_local() if isinstance(param, DTensor) else param
            assert tuple(local.shape) == tuple(rows[name].shape), (name, tuple(local.shape), tuple(rows[name].shape))
            local.copy_(rows[name])
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])
