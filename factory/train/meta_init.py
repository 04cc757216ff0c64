"""A model for FSDP that no rank ever holds whole: built on the meta device, sharded, then filled shard by shard with
exactly the bytes `build_model` gives.

An architecture initialises its weights in its constructor, drawing from the seeded global generator in an order of its
own (construction, then `apply`, then per-layer fixes). So `build_model` itself runs twice, with every parameter moved
to the meta device as it is registered. The first build gives the module tree to shard (its buffers, such as rotary
tables, are computed on the CPU as usual). After `fully_shard` and `to_empty`, the second build replays the
initialisation: every write into a parameter (an `nn.init` function, a fill, a random draw) runs on a full-size scratch
tensor on the CPU instead, so the generator advances exactly as in an ordinary build, and this rank copies its rows of
the result into its shard of the parameter registered at the same place in the first build. One parameter is whole at
a time.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from factory.config.schema import ModelConfig
from factory.errors import ConfigError
from factory.models.build import build_model
from factory.train.distributed import is_dtensor

OVERWRITES = frozenset({"normal_", "uniform_", "zero_", "fill_", "copy_", "bernoulli_", "exponential_", "log_normal_", "cauchy_",
                        "geometric_", "random_"})
"""In-place tensor methods whose result does not depend on the values they overwrite."""
NOT_WRITES = frozenset({"requires_grad_", "share_memory_", "retain_grad"})
"""In-place by name, but they write no values."""
IS_META = torch.Tensor.is_meta.__get__


def rows_of(value: torch.Tensor, rank: int, ranks: int) -> torch.Tensor:
    """This rank's rows of a full tensor (a view) as FSDP2 shards it along the first dimension (`torch.chunk`: the last
    ranks may get fewer rows, or none); a scalar is whole."""
    if value.dim() == 0:
        return value.detach()
    per = math.ceil(value.size(0) / ranks)
    start = min(rank * per, value.size(0))
    return value.detach()[start : min(start + per, value.size(0))]


Write = Callable[[int, torch.Tensor], None]
"""Hears the whole value a parameter takes: the parameter's place in the order of registration, and the value."""


class ShardedBuild(TorchFunctionMode):
    """Active while an architecture builds: parameters go to the meta device, their writes to a scratch tensor."""

    def __init__(self, arch: str, write: Write | None) -> None:
        """`write`: hears each value; None only lays the module tree out (nothing is computed, the generator is not drawn)."""
        super().__init__()
        self.arch, self.write = arch, write
        self.registered: list[nn.Parameter] = []
        """The meta parameters in the order they were registered."""
        self.places: dict[int, int] = {}
        """id of a meta parameter -> its place in `registered`."""
        self._open: tuple[torch.Tensor, torch.Tensor] | None = None
        """The parameter being written and its whole value: later in-place writes to it (a truncation) apply there."""
        self._buffer = torch.empty(0, dtype=torch.uint8)

    def register(self, module: nn.Module, name: str, param: nn.Parameter | None) -> nn.Parameter | None:
        """The parameter registration hook: a meta parameter in place of the real one, whose value is written out."""
        if param is None or param.device.type == "meta":
            return None
        self._close()
        meta = nn.Parameter(torch.empty_like(param, device="meta"), requires_grad=param.requires_grad)
        self.places[id(meta)] = len(self.registered)
        self.registered.append(meta)  # held, so ids stay unique
        if self.write is not None:
            self.write(self.places[id(meta)], param.detach())
        return meta

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        target = args[0] if args else kwargs.get("tensor")
        if not isinstance(target, torch.Tensor) or target.device.type != "meta":
            return func(*args, **kwargs)
        if func == IS_META and self.write is not None and id(target) in self.places:
            return False  # `nn.init` skips drawing for a meta tensor: here it must draw, into the scratch value
        if not _writes(func, name):
            return func(*args, **kwargs)
        if id(target) not in self.places:
            raise ConfigError(f"architecture {self.arch!r} writes a tensor on the meta device that is not one of its parameters "
                              f"({name}, a `.data` of one?), so FSDP cannot initialise it shard by shard: use parallelism: ddp")
        if self.write is None:
            return func(*args, **kwargs)  # on the meta device: nothing computed
        whole = self._open[1] if self._open is not None and self._open[0] is target else None
        if whole is None:
            if getattr(func, "__module__", None) != "torch.nn.init" and name not in OVERWRITES:
                raise ConfigError(f"architecture {self.arch!r} initialises a parameter with {name}, which reads values written "
                                  "before, so FSDP cannot initialise it shard by shard: use parallelism: ddp")
            self._close()
            whole = self._scratch(target)
            self._open = (target, whole)
        swap = (lambda value: whole if value is target else value)
        func(*(swap(a) for a in args), **{key: swap(value) for key, value in kwargs.items()})
        return whole  # what the write returns is read on (a rejection sampler draws until its result is in range)

    def _scratch(self, target: torch.Tensor) -> torch.Tensor:
        """Room for the whole value of `target` on the CPU: one buffer, grown as needed, serves every parameter in turn (a
        fresh tensor for each would leave the heap holding a model's worth of freed ones)."""
        size = target.numel() * target.element_size()
        if self._buffer.numel() < size:
            self._buffer = torch.empty(size, dtype=torch.uint8)
        return self._buffer[:size].view(target.dtype).view(target.shape)

    def _close(self) -> None:
        """Write out the value of the parameter last written, and let it go."""
        if self._open is not None and self.write is not None:
            target, whole = self._open
            self._open = None
            self.write(self.places[id(target)], whole)

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self._close()
        super().__exit__(*exc)


def _writes(func: Callable[..., Any], name: str) -> bool:
    """Whether `func` writes into its first argument."""
    if getattr(func, "__module__", None) == "torch.nn.init":
        return True
    if name in NOT_WRITES:
        return False
    return name == "__setitem__" or name.startswith("__i") or (name.endswith("_") and not name.startswith("__"))


@contextlib.contextmanager
def sharded_build(arch: str, write: Write | None) -> Iterator[ShardedBuild]:
    """Modules built in this block get meta parameters; `write` hears every whole value one of them takes, in order."""
    build = ShardedBuild(arch, write)
    hook = nn.modules.module.register_module_parameter_registration_hook(build.register)
    try:
        with build:
            yield build
    finally:
        hook.remove()


def build_on_meta(config: ModelConfig, vocab_size: int, seed: int) -> tuple[nn.Module, list[list[str]]]:
    """`build_model`'s model with its parameters on the meta device (buffers computed), and the names each parameter
    registered during the build ends up under (none for one replaced, a tied one under several), in order of registration."""
    with sharded_build(config.arch, None) as build:
        model = build_model(config, vocab_size, seed)
    derived = [name for name, param in model.named_parameters() if id(param) not in build.places]
    derived += [name for name, buffer in model.named_buffers() if buffer.device.type == "meta"]
    if derived:
        raise ConfigError(f"architecture {config.arch!r} computes {derived[0]} from its parameters while it builds, so FSDP cannot "
                          "initialise it shard by shard: use parallelism: ddp")
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return model, [names.get(id(param), []) for param in build.registered]


def replay(config: ModelConfig, vocab_size: int, seed: int, places: list[list[str]], write: Callable[[list[str], torch.Tensor], None]) -> None:
    """Run `build_model`'s initialisation again, handing `write` every whole value a parameter takes with the names it has
    in the model `build_on_meta` built (`places`), one at a time and in order: the last value of a name is its weight."""
    with sharded_build(config.arch, lambda place, whole: write(places[place], whole)):
        build_model(config, vocab_size, seed)


def materialise(model: nn.Module, places: list[list[str]], config: ModelConfig, vocab_size: int, seed: int, rank: int, ranks: int,
                device: torch.device) -> None:
    """Allocate a sharded meta model's shards on `device` and fill them with their rows of `build_model`'s weights; its
    buffers keep their values, tied parameters stay tied."""
    buffers = {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
    model.to_empty(device=device)
    params = dict(model.named_parameters(remove_duplicate=False))

    def write(names: list[str], whole: torch.Tensor) -> None:
        rows = rows_of(whole, rank, ranks)
        with torch.no_grad():
            for name in names:
                local = params[name].to_local() if is_dtensor(params[name]) else params[name]
                assert tuple(local.shape) == tuple(rows.shape), (name, tuple(local.shape), tuple(rows.shape))
                local.copy_(rows)

    replay(config, vocab_size, seed, places, write)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])
