"""The pretraining loop: seeded, AdamW with warmup + cosine, gradient clipping, periodic checkpoints."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn import functional as F

from factory.config.schema import ModelConfig, PretrainConfig
from factory.data.loader import PAD, Batch, LoaderState
from factory.errors import ConfigError
from factory.models.gpt import GPT, build_model

FINAL_CHECKPOINT = "final.pt"
METRICS_FILE = "metrics.jsonl"
POSITIONS_FILE = "data_positions.jsonl"
MetricSink = Callable[[int, dict[str, float]], None]


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainResult:
    """What a finished run reports."""

    steps: int
    final_loss: float
    tokens_seen: int
    parameters: int
    checkpoints: tuple[str, ...]
    seconds: float


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


def pretrain(
    batches: Iterator[Batch],
    vocab_size: int,
    model_config: ModelConfig,
    config: PretrainConfig,
    seed: int,
    out_dir: Path,
    log: logging.Logger,
    on_metrics: MetricSink | None = None,
) -> TrainResult:
    """Train a fresh model on `batches`; write checkpoints, a metrics log and the data positions into `out_dir`.

    `data_positions.jsonl` records the loader's position before every `log_every`-th step, so any
    batch can be fetched again later (`factory data batch`).
    """
    model = build_model(model_config, vocab_size, seed)
    optimizer = build_optimizer(model, config)
    torch.manual_seed(seed)  # dropout
    position = LoaderState()
    tokens_seen = 0
    out_dir.mkdir(parents=True, exist_ok=True)
    checkpoints: list[str] = []
    started = time.perf_counter()
    model.train()
    with open(out_dir / METRICS_FILE, "w") as metrics_file, open(out_dir / POSITIONS_FILE, "w") as positions_file:
        for step in range(config.steps):
            lr = lr_at(step, config)
            for group in optimizer.param_groups:
                group["lr"] = lr
            if step % config.log_every == 0:
                positions_file.write(json.dumps({"step": step, "state": position.to_json()}) + "\n")
            batch = next(batches, None)
            if batch is None:
                raise ConfigError(
                    f"the blend ran out of documents after {step} of {config.steps} steps: give a part `mode: oversample`, "
                    "add data, or lower pretrain.steps"
                )
            position, tokens_seen = batch.state, tokens_seen + batch.real_tokens
            logits = model(batch.x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), batch.y.view(-1), ignore_index=PAD)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip if config.grad_clip > 0 else float("inf"))
            optimizer.step()
            done = step + 1
            if done % config.log_every == 0 or done == config.steps:
                row = {"step": done, "loss": round(loss.item(), 6), "lr": lr, "grad_norm": round(grad_norm.item(), 6)}
                metrics_file.write(json.dumps(row) + "\n")
                log.info("step %d/%d loss %.4f lr %.2e", done, config.steps, row["loss"], lr)
                if on_metrics:
                    on_metrics(done, row)
            if config.checkpoint_every and done % config.checkpoint_every == 0 and done < config.steps:
                name = f"step_{done:06d}.pt"
                save_checkpoint(out_dir / name, model, optimizer, done, position)
                checkpoints.append(name)
    save_checkpoint(out_dir / FINAL_CHECKPOINT, model, optimizer, config.steps, position)
    checkpoints.append(FINAL_CHECKPOINT)
    return TrainResult(
        steps=config.steps,
        final_loss=loss.item(),
        tokens_seen=tokens_seen,
        parameters=model.num_parameters(),
        checkpoints=tuple(checkpoints),
        seconds=time.perf_counter() - started,
    )


def save_checkpoint(path: Path, model: GPT, optimizer: torch.optim.Optimizer, step: int, position: LoaderState) -> None:
    """Full training state; written to a temp name and renamed, so a checkpoint is whole or absent."""
    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "data_position": position.to_json(),
        "torch_rng": torch.random.get_rng_state(),
    }
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(path)


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """The model weights of a checkpoint or exported model file."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    return state["model"] if "model" in state else state
