"""Trainer overhead and checkpoint stalls, measured side by side in one run (`make bench`).

1. Tokens/s of the factory trainer (`factory.train.pretrain`: checkpoints every 25 steps with
   retention, the metrics log, a metrics sink standing where Dagster Pipes sits) vs. a bare torch
   loop on the same model, batches (in memory) and optimizer. Goal: >= 0.97.
2. The time a checkpoint save blocks the step loop (timed around the save call), synchronous vs. asynchronous, one
   file vs. sharded (torch.distributed.checkpoint, one rank here), and how much the steps overlapping an async write
   slow down.

Runs alternate (bare, factory, bare, factory, ...) and the best of each is kept, so a noisy
neighbour hurts both sides alike. `--smoke`: a few steps of one round each, to check the bench runs.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from factory.config.schema import ModelConfig, PretrainConfig
from factory.data.loader import PAD, Batch, LoaderState
from factory.models.build import build_model
from factory.train.checkpoint import CheckpointDir
from factory.train.heap import keep_freed_memory
from factory.train.pretrain import build_optimizer, lr_at, pretrain

LOG = logging.getLogger("bench.trainer")
VOCAB = 2048


@dataclass(frozen=True, kw_only=True, slots=True)
class Sizes:
    """Rounds and steps of each measure."""

    overhead_rounds: int = 6
    """Runs of ~2 s each vary by +-4% on a busy 2-core machine: more rounds, and the median beside the best."""
    overhead_steps: int = 100
    warmup_steps: int = 10
    batch_size: int = 16
    checkpoint_every: int = 25
    stall_rounds: int = 3
    stall_steps: int = 30
    save_every: int = 10
    stall_model: ModelConfig = ModelConfig(n_layer=4, n_head=8, n_embd=384, context=64)


SMOKE = Sizes(overhead_rounds=1, overhead_steps=6, warmup_steps=1, batch_size=2, checkpoint_every=3, stall_rounds=1, stall_steps=6,
              save_every=2, stall_model=ModelConfig(n_layer=1, n_head=2, n_embd=32, context=16))


def make_batches(steps: int, batch_size: int, context: int) -> list[Batch]:
    """Random token batches, built once, so neither side pays for data."""
    generator = torch.Generator().manual_seed(0)
    batches = []
    for step in range(steps):
        seqs = torch.randint(0, VOCAB, (batch_size, context + 1), generator=generator)
        x, y = seqs[:, :-1].clone(), seqs[:, 1:].clone()
        batches.append(Batch(x=x, y=y, documents=(), state=LoaderState(slot=step + 1), real_tokens=y.numel(), global_tokens=y.numel()))
    return batches


def bare_loop(batches: list[Batch], model_config: ModelConfig, config: PretrainConfig) -> float:
    """The reference: the same steps with nothing around them (model and optimizer built inside the timing, as the
    trainer builds its own); returns seconds."""
    started = time.perf_counter()
    model = build_model(model_config, VOCAB, 0)
    optimizer = build_optimizer(model, config)
    model.train()
    for step, batch in enumerate(batches):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, config)
        optimizer.zero_grad(set_to_none=True)
        logits = model(batch.x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), batch.y.view(-1), ignore_index=PAD)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        loss.item()
    return time.perf_counter() - started


def factory_loop(batches: list[Batch], model_config: ModelConfig, config: PretrainConfig, work: Path) -> tuple[float, list[float]]:
    """The factory trainer on the same batches; returns seconds and the wall time of every step."""
    stamps: list[float] = []

    def data(state: LoaderState | None):
        for batch in batches[state.slot if state else 0 :]:
            stamps.append(time.perf_counter())
            yield batch

    sink: list[dict] = []
    started = time.perf_counter()
    pretrain(data, VOCAB, model_config, config, 0, work, LOG, on_metrics=lambda step, row: sink.append(row))
    elapsed = time.perf_counter() - started
    stamps.append(time.perf_counter())
    return elapsed, [b - a for a, b in zip(stamps, stamps[1:])]


def overhead(sizes: Sizes) -> None:
    model_config = ModelConfig(n_layer=2, n_head=4, n_embd=128, context=128)
    config = PretrainConfig(steps=sizes.overhead_steps, batch_size=sizes.batch_size, lr=3e-3, warmup_steps=sizes.warmup_steps,
                            checkpoint_every=sizes.checkpoint_every, log_every=10, keep_last=2)
    batches = make_batches(config.steps, config.batch_size, model_config.context)
    tokens = config.steps * config.batch_size * model_config.context
    bare, ours = [], []
    keep_freed_memory()  # the trainer sets the allocator up for the whole process: the reference gets it from its first round
    bare_loop(batches[:3], model_config, config)  # warm-up, untimed: the process's first steps pay for lazy initialisation
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(sizes.overhead_rounds):
            bare.append(bare_loop(batches, model_config, config))
            ours.append(factory_loop(batches, model_config, config, Path(tmp) / f"run{round_}")[0])
    print(f"trainer: bare torch loop {tokens / min(bare):,.0f} tokens/s, factory trainer {tokens / min(ours):,.0f} tokens/s")
    print(f"trainer: factory / bare = {min(bare) / min(ours):.3f} best, {statistics.median(bare) / statistics.median(ours):.3f} median "
          f"(goal >= 0.97; {sizes.overhead_rounds} rounds, alternating)")


@contextlib.contextmanager
def blocked_in_saves() -> Iterator[list[float]]:
    """The seconds each mid-run `CheckpointDir.save` call holds the step loop (the final save aside), measured around the
    call itself: what a save costs the loop, not a difference of two noisy run totals."""
    blocked: list[float] = []
    original = CheckpointDir.save

    def timed(self: CheckpointDir, step: int, state: Any, metrics: Any, final: bool = False) -> None:
        started = time.perf_counter()
        original(self, step, state, metrics, final)
        if not final:
            blocked.append(time.perf_counter() - started)

    CheckpointDir.save = timed  # type: ignore[method-assign]
    try:
        yield blocked
    finally:
        CheckpointDir.save = original  # type: ignore[method-assign]


def stall(sizes: Sizes) -> None:
    """Per mid-run save: the time the loop is blocked in the save call, and, for async saves, how much slower the steps
    that overlap the background write are than the same steps of a run without saves. Median and range over every save
    of every round."""
    model_config = sizes.stall_model
    steps, every, overlap = sizes.stall_steps, sizes.save_every, 3
    batches = make_batches(steps, 8, model_config.context)
    base = PretrainConfig(steps=steps, batch_size=8, lr=1e-3, checkpoint_every=0, log_every=10, keep_last=2)
    sharded = {"checkpoint_every": every, "checkpoint_format": "sharded"}
    modes = {"none": base, "sync": base.model_copy(update={"checkpoint_every": every}),
             "async": base.model_copy(update={"checkpoint_every": every, "async_checkpoints": True}),
             "sharded sync": base.model_copy(update=sharded),
             "sharded async": base.model_copy(update={**sharded, "async_checkpoints": True})}
    blocked: dict[str, list[float]] = {name: [] for name in modes}
    walls: dict[str, list[list[float]]] = {name: [] for name in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(sizes.stall_rounds):
            for name, config in modes.items():
                with blocked_in_saves() as calls:
                    walls[name].append(factory_loop(batches, model_config, config, Path(tmp) / f"{name}{round_}")[1])
                blocked[name] += calls
    state_mb = sum(p.numel() for p in build_model(model_config, VOCAB, 0).parameters()) * 4 * 3 / 1e6
    quiet = [statistics.median(run[i] for run in walls["none"]) for i in range(steps)]  # each step without saves
    print(f"checkpoint stall: {state_mb:.0f} MB of state, a step takes {1000 * statistics.median(quiet):.0f} ms; "
          f"{len(blocked['sync'])} mid-run saves per mode ({sizes.stall_rounds} rounds)")
    for name in (n for n in modes if n != "none"):
        ms = [1000 * b for b in blocked[name]]
        # the steps after each save (a step's wall time is counted from its batch to the next one, the save inside it)
        after = [1000 * (run[i] - quiet[i]) for run in walls[name] for saved in range(every, steps, every)
                 for i in range(saved, min(saved + overlap, steps - 1))]
        print(f"checkpoint stall: {name:13s} blocks the loop {statistics.median(ms):6.1f} ms (range {min(ms):.1f}-{max(ms):.1f}); "
              f"the {overlap} steps after it are slower by {statistics.median(after):+6.1f} ms each (median)")
    sync = statistics.median(blocked["sync"])
    for name in ("async", "sharded sync", "sharded async"):
        print(f"checkpoint stall: {name} / sync blocked time = {statistics.median(blocked[name]) / sync:.2f} (lower is better)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few steps of one round each: checks the bench runs")
    sizes = SMOKE if parser.parse_args().smoke else Sizes()
    torch.manual_seed(0)
    overhead(sizes)
    stall(sizes)


if __name__ == "__main__":
    main()
