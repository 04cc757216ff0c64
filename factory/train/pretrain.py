"""The pretraining loop: seeded, AdamW with warmup + cosine, gradient clipping and accumulation, ranks, checkpoints.

A run lives in a work directory. Relaunched on the same directory, it resumes from the latest
complete checkpoint: model, optimizer, step, RNG state of every rank and the loader's position
are restored, so the final weights are the bytes an uninterrupted run would have written.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

from factory.config.schema import ModelConfig, PretrainConfig
from factory.data.loader import PAD, Batch, LoaderState
from factory.errors import ConfigError, StageFailed
from factory.models.gpt import GPT, build_model
from factory.train.checkpoint import CheckpointDir, RetentionPolicy
from factory.train.distributed import SINGLE, World, gather, total

CHECKPOINT_DIR = "checkpoints"
METRICS_FILE = "metrics.jsonl"
POSITIONS_FILE = "data_positions.jsonl"
MetricSink = Callable[[int, dict[str, float]], None]
BatchSource = Callable[[LoaderState | None], Iterator[Batch]]
"""Batches from a position on (None: from the start), this rank's slice of each global batch."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainResult:
    """What a finished run reports."""

    steps: int
    final_loss: float
    tokens_seen: int
    parameters: int
    checkpoints: tuple[str, ...]
    """Checkpoint files kept, oldest first; the last is the final one."""
    seconds: float
    resumed_from: int
    """The step training resumed at (0: a fresh start)."""


def lr_at(step: int, config: PretrainConfig) -> float:
    """Linear warmup to `lr`, then cosine decay to `lr * min_lr_ratio` at the last step."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps - 1)
    floor = config.lr * config.min_lr_ratio
    return floor + 0.5 * (config.lr - floor) * (1 + math.cos(math.pi * min(1.0, progress)))


def build_optimizer(model: GPT, config: PretrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms, biases)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas)


def precision_of(config: PretrainConfig, device: torch.device) -> torch.dtype | None:
    """The autocast dtype: bf16 when asked for (or `auto` on a GPU that has it), else None (fp32)."""
    if config.precision == "bf16":
        return torch.bfloat16
    if config.precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


def pretrain(
    data: BatchSource,
    vocab_size: int,
    model_config: ModelConfig,
    config: PretrainConfig,
    seed: int,
    work_dir: Path,
    log: logging.Logger,
    on_metrics: MetricSink | None = None,
    world: World = SINGLE,
) -> TrainResult:
    """Train (or resume training) a model; checkpoints, metrics and data positions go to `work_dir`.

    `data_positions.jsonl` records the loader's position before every `log_every`-th step, so any
    batch can be fetched again later (`factory data batch`). Only rank 0 writes files and reports.
    """
    device = world.device
    model = build_model(model_config, vocab_size, seed).to(device)
    optimizer = build_optimizer(model, config)
    torch.manual_seed(seed + world.rank)  # dropout differs per rank, as their batches do
    policy = RetentionPolicy(keep_last=config.keep_last, best_metric=config.keep_best_by)
    checkpoints = CheckpointDir(work_dir / CHECKPOINT_DIR, policy, log, asynchronous=config.async_checkpoints)
    start, position, tokens_seen = 0, LoaderState(), 0
    if world.is_main:
        work_dir.mkdir(parents=True, exist_ok=True)
        checkpoints.drop_incomplete()
    found = checkpoints.latest()
    if found is not None:
        saved, state = found
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start, position, tokens_seen = state["step"], LoaderState.from_json(state["data_position"]), state["tokens_seen"]
        torch.random.set_rng_state(state["rng"][world.rank]["torch"])
        log.info("resuming from %s at step %d of %d", saved.name, start, config.steps)
    if world.is_main:
        _truncate(work_dir / METRICS_FILE, start, inclusive=True)
        _truncate(work_dir / POSITIONS_FILE, start, inclusive=False)
    autocast = precision_of(config, device)
    network = torch.compile(model) if config.compile else model
    if world.size > 1:
        network = DistributedDataParallel(network)
    batches = data(position if start else None)
    started = time.perf_counter()
    interval_losses: list[float] = []
    logged_at, logged_tokens, logged_step = time.perf_counter(), tokens_seen, start
    loss_value = _last_logged_loss(work_dir / METRICS_FILE) if start == config.steps else float("nan")
    network.train()
    with _appending(work_dir, world) as (metrics_file, positions_file):
        for step in range(start, config.steps):
            lr = lr_at(step, config)
            for group in optimizer.param_groups:
                group["lr"] = lr
            if positions_file and step % config.log_every == 0:
                positions_file.write(json.dumps({"step": step, "state": position.to_json()}) + "\n")
                positions_file.flush()
            batch = next(batches, None)
            if batch is None:
                raise ConfigError(
                    f"the blend ran out of documents after {step} of {config.steps} steps: give a part `mode: oversample`, "
                    "add data, or lower pretrain.steps"
                )
            try:
                loss_value, grad_norm = _step(network, optimizer, batch, config, world, autocast, device)
            except (torch.OutOfMemoryError, MemoryError) as e:
                raise StageFailed(
                    f"out of memory at step {step + 1}; {_kept(checkpoints)}. Lower pretrain.batch_size, raise grad_accum_steps "
                    "or shrink the model"
                ) from e
            position, tokens_seen = batch.state, tokens_seen + batch.global_tokens
            if not math.isfinite(loss_value):
                raise StageFailed(f"the training loss became {loss_value} at step {step + 1}; {_kept(checkpoints)}. Lower pretrain.lr or raise grad_clip")
            interval_losses.append(loss_value)
            done = step + 1
            if done % config.log_every == 0 or done == config.steps:
                now = time.perf_counter()
                row = {
                    "step": done, "loss": round(loss_value, 6), "lr": lr, "grad_norm": round(grad_norm, 6),
                    "tokens_per_second": round((tokens_seen - logged_tokens) / max(now - logged_at, 1e-9), 1),
                    "step_seconds": round((now - logged_at) / (done - logged_step), 6),
                }
                logged_at, logged_tokens, logged_step = now, tokens_seen, done
                if metrics_file:
                    metrics_file.write(json.dumps(row) + "\n")
                    metrics_file.flush()
                    log.info("step %d/%d loss %.4f lr %.2e", done, config.steps, row["loss"], lr)
                    if on_metrics:
                        on_metrics(done, row)
            if done == config.steps or (config.checkpoint_every and done % config.checkpoint_every == 0):
                state = _state(model, optimizer, done, position, tokens_seen, world)
                if world.is_main:
                    metrics = {"loss": sum(interval_losses) / len(interval_losses), "lr": lr, "tokens_seen": tokens_seen}
                    checkpoints.save(done, state, metrics, final=done == config.steps)
                interval_losses = []
    checkpoints.wait()
    kept = tuple(c.name for c in checkpoints.complete())
    return TrainResult(
        steps=config.steps,
        final_loss=loss_value,
        tokens_seen=tokens_seen,
        parameters=model.num_parameters(),
        checkpoints=kept,
        seconds=time.perf_counter() - started,
        resumed_from=start,
    )


def _kept(checkpoints: CheckpointDir) -> str:
    """What a failed run leaves to resume from."""
    kept = checkpoints.complete()
    return f"the last good checkpoint ({kept[-1].name}) is kept" if kept else "no checkpoint was saved yet"


def _step(
    network: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, config: PretrainConfig, world: World,
    autocast: torch.dtype | None, device: torch.device,
) -> tuple[float, float]:
    """One optimizer step over this rank's slice, in `grad_accum_steps` micro-batches; returns the global mean loss and
    the gradient norm before clipping.

    Each micro-batch's loss is its summed token loss over the global batch's token count (times
    the world size, which gradient averaging across ranks divides out), so every rank count and
    every accumulation split computes the same mean.
    """
    micro = batch.x.size(0) // config.grad_accum_steps
    if micro == 0:
        raise ConfigError(f"each rank gets {batch.x.size(0)} sequences, fewer than pretrain.grad_accum_steps ({config.grad_accum_steps})")
    scale = world.size / max(1, batch.global_tokens)
    summed = 0.0
    optimizer.zero_grad(set_to_none=True)
    for i in range(config.grad_accum_steps):
        x = batch.x[i * micro : (i + 1) * micro].to(device)
        y = batch.y[i * micro : (i + 1) * micro].to(device)
        last = i == config.grad_accum_steps - 1
        sync = contextlib.nullcontext() if last or not isinstance(network, DistributedDataParallel) else network.no_sync()
        with sync, torch.autocast(device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
            logits = network(x)
            loss_sum = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), y.view(-1), ignore_index=PAD, reduction="sum")
            (loss_sum * scale).backward()
        summed += loss_sum.item()
    grad_norm = torch.nn.utils.clip_grad_norm_(network.parameters(), config.grad_clip if config.grad_clip > 0 else float("inf"))
    optimizer.step()
    return total(world, summed) / max(1, batch.global_tokens), float(grad_norm)


def _state(model: GPT, optimizer: torch.optim.Optimizer, step: int, position: LoaderState, tokens_seen: int, world: World) -> dict[str, Any]:
    """The full training state; every rank's RNG is gathered so each resumes its own."""
    rng = {"torch": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    return {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "data_position": position.to_json(),
        "tokens_seen": tokens_seen,
        "rng": gather(world, rng),
    }


@contextlib.contextmanager
def _appending(work_dir: Path, world: World) -> Iterator[tuple[Any, Any]]:
    """The metrics and positions logs, opened for appending on rank 0 (None elsewhere)."""
    if not world.is_main:
        yield None, None
        return
    with open(work_dir / METRICS_FILE, "a") as metrics, open(work_dir / POSITIONS_FILE, "a") as positions:
        yield metrics, positions


def _last_logged_loss(path: Path) -> float:
    """The loss of the last row of the metrics log (a run resumed after its final checkpoint trains no step)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return float(rows[-1]["loss"]) if rows else float("nan")


def _truncate(path: Path, step: int, inclusive: bool) -> None:
    """Keep the rows of a JSONL log up to `step` (rows after it will be written again by the resumed run)."""
    if not path.exists():
        return
    last = step if inclusive else step - 1
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= last]
    path.write_text("".join(line + "\n" for line in kept))


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """The model weights of a checkpoint or exported model file."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    return state["model"] if "model" in state else state
