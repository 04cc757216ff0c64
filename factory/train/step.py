"""The forward passes of the loop: one step's gradients, the validation loss, and peak memory."""

from __future__ import annotations

import contextlib
import functools
import resource
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch
from torch.nn.parallel import DistributedDataParallel

from factory.config.schema import PretrainConfig
from factory.data.loader import PAD, Batch
from factory.errors import ConfigError
from factory.train.distributed import World, gather, is_dtensor, is_fsdp, summed_over_ranks
from factory.train.objective import NEXT_TOKEN, Minimised, Objective, summed_cross_entropy
from factory.train.parallel import recomputation_off

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule


def gradients(
    network: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, config: PretrainConfig, world: World,
    autocast: torch.dtype | None, device: torch.device, want_samples: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
    """Gradients of one step over this rank's slice, in `grad_accum_steps` micro-batches, clipped; returns the global mean
    loss and the gradient norm before clipping, as 0-d tensors on `device` (nothing waits for the GPU: the caller reads
    them when it needs the numbers), and (when asked) the mean token loss of every sequence of the global batch. The
    caller applies the update (or, when a control rule says so, does not).

    `network(x, y)` is the model and its objective (`factory.train.objective.Minimised`, maybe compiled, under DDP): each
    micro-batch's loss is its summed loss (per-sequence losses need the next-token one) over the global batch's `units`
    (times the world size, which gradient averaging across ranks divides out), so every rank count and every
    accumulation split computes the same mean.
    """
    micro = batch.x.size(0) // config.grad_accum_steps
    if micro == 0:
        raise ConfigError(f"each rank gets {batch.x.size(0)} sequences, fewer than pretrain.grad_accum_steps ({config.grad_accum_steps})")
    scale = world.size / max(1, batch.units)
    sharded = _sharded(network)
    summed = torch.zeros((), dtype=torch.float64, device=device)
    samples: list[float] = []
    optimizer.zero_grad(set_to_none=True)
    xs, ys = to_device(batch.x, device), to_device(batch.y, device)
    for i in range(config.grad_accum_steps):
        x, y = xs[i * micro : (i + 1) * micro], ys[i * micro : (i + 1) * micro]
        last = i == config.grad_accum_steps - 1
        sync = contextlib.nullcontext() if last or not isinstance(network, DistributedDataParallel) else network.no_sync()
        if sharded is not None:  # reduce-scatter the gradients once, after the last micro-batch
            sharded.set_requires_gradient_sync(last)
        with sync, torch.autocast(device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
            if want_samples:
                token_losses = network(x, y, per_token=True)
                loss_sum = token_losses.sum()
                counts = (y != PAD).sum(dim=1).clamp(min=1)
                samples += (token_losses.detach().sum(dim=1) / counts).tolist()
            else:
                loss_sum = network(x, y)
            (loss_sum * scale).backward()
        summed += loss_sum.detach().double()
    grad_norm = torch.nn.utils.clip_grad_norm_(network.parameters(), config.grad_clip if config.grad_clip > 0 else float("inf"))
    if is_dtensor(grad_norm):  # sharded parameters: the norm over all shards
        grad_norm = grad_norm.full_tensor()
    if want_samples and world.size > 1:
        samples = [value for rank_samples in gather(world, samples) for value in rank_samples]
    return summed_over_ranks(world, summed) / max(1, batch.units), grad_norm.detach(), samples


def _sharded(network: torch.nn.Module) -> FSDPModule | None:
    """The FSDP-sharded model inside the network the loop calls (under compile and `Minimised`), or None."""
    inner = getattr(network, "_orig_mod", network)  # torch.compile's wrapper
    model = inner.model if isinstance(inner, Minimised) else inner
    return model if is_fsdp(model) else None


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` on `device`: to a GPU from pinned memory without waiting (a copy from pageable memory would wait for every
    kernel queued before it), elsewhere as it is."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def activation_memory(model: torch.nn.Module, batch: Batch, config: PretrainConfig, autocast: torch.dtype | None,
                      device: torch.device, objective: Objective = NEXT_TOKEN, frozen: Mapping[str, torch.nn.Module] | None = None,
                      ) -> dict[str, float]:
    """What the forward of one micro-batch (model and loss) keeps for the backward, measured: `activations_mb` as this run
    trains (recomputing the blocks it was asked to), `activations_saved_mb` what recomputation saves over keeping every
    block's activations. Every rank calls it (an FSDP forward gathers); random states and gradients are left as they were."""
    micro = max(1, batch.x.size(0) // config.grad_accum_steps)
    x, y = batch.x[:micro].to(device), batch.y[:micro].to(device)
    measure = functools.partial(_saved_mb, objective=objective, frozen=frozen or {})
    kept = measure(model, x, y, autocast, device)
    if config.activation_checkpointing == "none":
        return {"activations_mb": kept, "activations_saved_mb": 0.0}
    with recomputation_off(model):
        whole = measure(model, x, y, autocast, device)
    return {"activations_mb": kept, "activations_saved_mb": round(whole - kept, 3)}


def _saved_mb(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, autocast: torch.dtype | None, device: torch.device, *,
              objective: Objective, frozen: Mapping[str, torch.nn.Module]) -> float:
    """MB of the storages a forward and loss save for the backward (parameters and autocast's copies of them excluded),
    counted by saved-tensor hooks that keep none of them: the forward holds no more than an inference forward would, so
    measuring without recomputation costs no memory recomputation was asked to save (and moves no peak figure)."""
    counted: list[int] = []
    alive: dict[int, weakref.ref] = {}  # by address: a storage saved twice counts once, an address freed and reused twice

    def pack(tensor: torch.Tensor) -> None:
        if not isinstance(tensor, torch.nn.Parameter) and not _copy_of_a_parameter(tensor):
            storage = tensor.untyped_storage()
            before = alive.get(storage.data_ptr())
            if before is None or before() is None:
                counted.append(storage.nbytes())
                alive[storage.data_ptr()] = weakref.ref(tensor)
        # Nothing is kept: this graph is never run backward.

    with (
        torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),  # dropout draws: training's stream stays as it was
        torch.autograd.graph.saved_tensors_hooks(pack, lambda _: None),
        torch.autocast(device.type, dtype=autocast or torch.float32, enabled=autocast is not None),
    ):
        objective.loss(model, x, y, frozen)
    return round(sum(counted) / 2**20, 3)


def _copy_of_a_parameter(tensor: torch.Tensor) -> bool:
    """Whether a saved tensor is a parameter cast to another dtype (autocast's bf16 weights): weights, not activations."""
    step = tensor.grad_fn
    return (step is not None and type(step).__name__ == "ToCopyBackward0"
            and all(type(parent).__name__ == "AccumulateGrad" for parent, _ in step.next_functions if parent is not None))


def memory_mb(device: torch.device) -> dict[str, float]:
    """Peak memory so far: this process's resident set, and the GPU's allocations on a GPU."""
    peak = {"rss_peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}  # Linux reports KiB
    if device.type == "cuda":
        peak["gpu_peak_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    return peak


def validation_loss(model: torch.nn.Module, batches: Sequence[Batch], autocast: torch.dtype | None, device: torch.device) -> float:
    """Mean token loss over whole validation batches, without gradients (and without touching any RNG)."""
    model.eval()
    summed, tokens = 0.0, 0
    with torch.no_grad(), torch.autocast(device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
        for batch in batches:
            y = batch.y.to(device)
            summed += summed_cross_entropy(model(batch.x.to(device)), y).item()
            tokens += int((y != PAD).sum())
    model.train()
    return summed / max(1, tokens)
