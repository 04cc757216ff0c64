"""Data parallelism over the ranks: DDP (every rank holds the whole model) or FSDP2 (every rank holds a shard), and the
restore of a checkpoint's full state into either, whatever world size and parallelism wrote it.

Under FSDP the model's parameters and the optimizer's state are DTensors sharded along their first dimension;
`model.state_dict()` and `optimizer.state_dict()` keep the same keys as without it, so a sharded checkpoint has one
layout for both (torch.distributed.checkpoint writes each rank's shard, and reads back full tensors on any world size).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from factory.config.schema import ModelConfig, PretrainConfig
from factory.errors import ConfigError
from factory.models.build import build_model
from factory.train.distributed import World, is_dtensor, is_fsdp
from factory.train.meta_init import build_on_meta, materialise
from factory.train.objective import Minimised

BLOCK_LISTS = ("blocks", "layers")
"""The attribute names a model's list of transformer blocks goes by."""


def check_split(config: PretrainConfig, world: World, section: str = "pretrain") -> None:
    """Refuse, before any compute, a world whose ranks cannot share the global batch as the config asks."""
    if config.batch_size % world.size:
        raise ConfigError(
            f"{section}.batch_size ({config.batch_size}) must be divisible by the number of ranks ({world.size}): "
            f"change {section}.batch_size or resources.processes_per_node (a different world size keeps the global batch)"
        )
    share = config.batch_size // world.size
    if share % config.grad_accum_steps:
        raise ConfigError(
            f"each of the {world.size} ranks gets {share} sequences, which {section}.grad_accum_steps ({config.grad_accum_steps}) "
            "does not divide: lower grad_accum_steps or raise batch_size"
        )


def blocks_of(model: nn.Module, arch: str, asked: str = "parallelism: fsdp") -> list[nn.Module]:
    """The transformer blocks FSDP shards and activation checkpointing recomputes one by one (a model's `blocks` list, or
    `layers` as Hugging Face's Llama names it)."""
    blocks = next((found for found in (getattr(model, name, None) for name in BLOCK_LISTS) if isinstance(found, nn.ModuleList)), None)
    if blocks is None or len(blocks) == 0:
        undo = "use parallelism: ddp" if asked.startswith("parallelism") else "set activation_checkpointing: none"
        raise ConfigError(f"{asked} works block by block, but architecture {arch!r} has no `blocks` (or `layers`) list of transformer blocks: {undo}")
    return list(blocks)


def recompute_blocks(model: nn.Module, config: PretrainConfig, arch: str) -> int:
    """Make the blocks that `activation_checkpointing` names recompute their activations in the backward; returns how many."""
    if config.activation_checkpointing == "none":
        return 0
    every = 1 if config.activation_checkpointing == "full" else config.activation_checkpoint_every
    chosen = blocks_of(model, arch, "activation_checkpointing")[::every]
    for block in chosen:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)  # the module's hooks (FSDP's) stay outside
    return len(chosen)


@contextlib.contextmanager
def recomputation_off(model: nn.Module) -> Iterator[None]:
    """Within the block, the blocks `recompute_blocks` chose keep their activations as the others do."""
    chosen = {module: vars(module).pop("forward") for module in model.modules() if _recomputes(vars(module).get("forward"))}
    try:
        yield
    finally:
        for module, forward in chosen.items():
            module.forward = forward


def _recomputes(forward: Any) -> bool:
    """Whether a module's own `forward` is the recomputing one `recompute_blocks` set."""
    return isinstance(forward, functools.partial) and forward.func is checkpoint


def mixed_precision(device: torch.device) -> Any:
    """bf16 parameters with fp32 gradient reductions on a GPU that has bf16; fp32 throughout elsewhere."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard(model: nn.Module, config: PretrainConfig, world: World, arch: str) -> None:
    """Apply FSDP2 in place: each transformer block, then the root (embeddings, final norm, head). A world of one rank has
    nothing to shard over and keeps the whole model, as DDP's single rank does (its checkpoints are the same)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    blocks = blocks_of(model, arch)
    if world.size == 1:
        return
    mesh = init_device_mesh(world.device.type, (world.size,))
    policy = mixed_precision(world.device)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=config.reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=config.reshard_after_forward)


def build_for_training(
    model_config: ModelConfig, vocab_size: int, seed: int, config: PretrainConfig, world: World, init: Mapping[str, torch.Tensor] | None = None,
) -> nn.Module:
    """The model a run trains: `build_model`'s weights (or `init`'s), the blocks asked for recomputed, sharded under FSDP.
    Under FSDP on several ranks it is built on the meta device and filled shard by shard, so no rank holds it whole."""
    if config.parallelism == "fsdp" and world.size > 1:
        model, places = build_on_meta(model_config, vocab_size, seed)
        recompute_blocks(model, config, model_config.arch)  # before sharding: FSDP's hooks wrap the recomputed forward
        shard(model, config, world, model_config.arch)
        materialise(model, places, model_config, vocab_size, seed, world.rank, world.size, world.device)
    else:
        model = build_model(model_config, vocab_size, seed).to(world.device)
        recompute_blocks(model, config, model_config.arch)
        if config.parallelism == "fsdp":
            shard(model, config, world, model_config.arch)
    if init is not None:
        live = model.state_dict()
        model.load_state_dict({key: _like(value, live[key]) for key, value in init.items()})
    return model


def is_sharded(model: nn.Module) -> bool:
    """Whether FSDP2 shards the model."""
    return is_fsdp(model)


def wrap(minimised: Minimised, config: PretrainConfig, world: World) -> nn.Module:
    """The network the step loop calls, `network(x, y)` giving the loss: the model and its loss (`Minimised`), compiled
    together when asked, under DDP on several ranks (FSDP shards the model itself)."""
    network = torch.compile(minimised) if config.compile else minimised
    if world.size > 1 and not is_sharded(minimised.model):
        network = DistributedDataParallel(network)
    return network


def restore(model: nn.Module, optimizer: torch.optim.Optimizer, state: Mapping[str, Any], name: str) -> None:
    """Load a checkpoint's full (unsharded) model and optimizer state into a model that may be sharded, refusing another
    model shape with what to change; `name` names the checkpoint in that error."""
    live = model.state_dict()
    saved = state["model"]
    check_shape(name, {key: tuple(value.shape) for key, value in saved.items()}, {key: tuple(value.shape) for key, value in live.items()})
    model.load_state_dict({key: _like(value, live[key]) for key, value in saved.items()})
    params = [p for group in optimizer.param_groups for p in group["params"]]
    optim = state["optimizer"]
    optimizer.load_state_dict({
        "param_groups": implementation_here(optim["param_groups"], optimizer),
        "state": {index: {key: _like(value, params[index]) if _sharded_like(value, params[index]) else value for key, value in slots.items()}
                  for index, slots in optim["state"].items()},
    })


def implementation_here(saved: Sequence[Mapping[str, Any]], optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """A checkpoint's optimizer param groups with `optimizer`'s own implementation (fused on GPUs, torch's default on the
    CPU), so that a checkpoint resumes with the implementation of where it runs, not of where it was written (loading
    places the step counters where that implementation keeps them)."""
    return [{**group, **{key: live[key] for key in ("fused", "foreach") if key in live}}
            for group, live in zip(saved, optimizer.param_groups, strict=True)]


def check_shape(name: str, saved: Mapping[str, tuple[int, ...]], live: Mapping[str, tuple[int, ...]]) -> None:
    """Refuse a checkpoint (`name`) whose model tensors (name -> shape) are not the live model's, with what to change."""
    missing, unexpected = sorted(set(live) - set(saved)), sorted(set(saved) - set(live))
    shapes = [(key, saved[key], live[key]) for key in live if key in saved and saved[key] != live[key]]
    if missing or unexpected or shapes:
        what = (f"{shapes[0][0]} is {list(shapes[0][1])} there and {list(shapes[0][2])} here" if shapes
                else f"it lacks {missing[:3]}" if missing else f"it has {unexpected[:3]}, which this model lacks")
        raise ConfigError(
            f"checkpoint {name} holds a model of another shape than the model section asks for ({what}): restore the model "
            "section it was trained with, or train in a fresh work directory"
        )


def _sharded_like(value: Any, param: torch.Tensor) -> bool:
    """An optimizer slot (exp_avg, exp_avg_sq) that FSDP shards like its parameter, not a scalar such as `step`."""
    return isinstance(value, torch.Tensor) and is_dtensor(param) and tuple(value.shape) == tuple(param.shape)


def _like(value: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """A full tensor laid out as `live` is: this rank's shard of it when `live` is a DTensor (sliced here, no communication)."""
    if is_dtensor(live) and not is_dtensor(value):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(value.to(live.device), live.device_mesh, live.placements, src_data_rank=None)
    return value
