"""Does training control pay? Fixed budgets vs. the default control policy, on a suite of real runs.

Six small runs (different learning rates: one that diverges, one that plateaus early, one that
keeps improving) train a byte-level GPT on the interpreter's standard library, once with a fixed
budget and fixed-interval checkpoints, once under the `control:` section of
`experiments/tiny-code-lm-controlled.md` (same budget as a ceiling). For each: compute (steps and
CPU-seconds, in-loop evaluations included), checkpoint bytes written, and the final model's loss
on held-out files that neither side ever evaluated on during training.

Two regimes: a generous budget for the data (where fixed budgets waste compute: the case control
is for, since nobody knows in advance when a run is done) and a budget about right (where they do
not). `python bench/control_savings.py generous` runs one regime; `--smoke` two runs of a few dozen steps, to check
the bench runs.

Targets: >= 3x less compute in total, >= 2x less checkpoint storage, every run's final loss within
5% of (or better than) its fixed-budget run.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from factory.config import load
from factory.config.control import ControlConfig
from factory.config.schema import ModelConfig, PretrainConfig
from factory.data.loader import Batch, LoaderState
from factory.train.pretrain import CHECKPOINT_DIR, load_weights, pretrain
from factory.train.step import validation_loss
from factory.models.build import new_model

LOG = logging.getLogger("bench.control")
POLICY = Path(__file__).resolve().parents[1] / "experiments" / "tiny-code-lm-controlled.md"
MODEL = ModelConfig(n_layer=2, n_head=4, n_embd=64, context=64)
BATCH = 16
REGIMES = {  # name -> (training bytes, fixed budget in steps, what the budget is for that much data)
    "generous": (30_000, 3000, "a generous budget: the runs have nothing left to learn long before it ends"),
    "about-right": (60_000, 2000, "a budget about right: most fixed runs still improve at the end"),
}
SMOKE_REGIME = (5_000, 30, "a smoke run: checks the bench runs, its figures mean little")
SMOKE_RUNS = ("lr=1e-3", "lr=1")
FIXED_CHECKPOINT_EVERY = 50
RUNS = {  # name -> (lr, what it shows)
    "lr=1e-4": (1e-4, "slow: keeps improving"),
    "lr=3e-4": (3e-4, "steady"),
    "lr=1e-3": (1e-3, "fast"),
    "lr=3e-3": (3e-3, "overfits"),
    "lr=1e-2": (1e-2, "plateaus early"),
    "lr=1": (1.0, "diverges"),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    steps: int
    cpu_s: float
    checkpoint_bytes: int
    final_loss: float
    stopped_by: str | None


def corpus(train_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bytes of standard-library .py files: a small training set (the budget is generous for it: the common case where a
    fixed budget wastes compute) and held-out files (by hash of path)."""
    train, held_out = bytearray(), bytearray()
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        data = path.read_bytes()
        if hashlib.sha256(path.name.encode()).digest()[0] < 26:
            held_out.extend(data)
        elif len(train) < train_bytes:
            train.extend(data)
    return torch.tensor(list(train[:train_bytes]), dtype=torch.int64), torch.tensor(list(held_out), dtype=torch.int64)


def windows(tokens: torch.Tensor, seed: int, count: int) -> torch.Tensor:
    starts = torch.randint(0, len(tokens) - MODEL.context - 1, (count,), generator=torch.Generator().manual_seed(seed))
    return torch.stack([tokens[s : s + MODEL.context + 1] for s in starts.tolist()])


def batch_of(seqs: torch.Tensor, step: int) -> Batch:
    return Batch(x=seqs[:, :-1].clone(), y=seqs[:, 1:].clone(), documents=(), state=LoaderState(slot=step + 1),
                 real_tokens=seqs[:, 1:].numel(), global_tokens=seqs[:, 1:].numel())


def train_one(
    work: Path, train: torch.Tensor, validation: list[Batch], test: list[Batch], lr: float, budget: int, control: ControlConfig | None
) -> Outcome:
    config = PretrainConfig(steps=budget, batch_size=BATCH, lr=lr, warmup_steps=20, log_every=100, keep_last=1_000,
                            checkpoint_every=0 if control else FIXED_CHECKPOINT_EVERY, keep_best_by=None)

    def data(state: LoaderState | None):
        step = state.slot if state else 0
        while True:
            yield batch_of(windows(train, step, BATCH), step)
            step += 1

    started = time.process_time()
    result = pretrain(data, 256, MODEL, config, 0, work, LOG, control=control, validation=validation)
    cpu_s = time.process_time() - started
    model = new_model(MODEL, 256)
    model.load_state_dict(load_weights(work / CHECKPOINT_DIR / result.checkpoints[-1]))
    return Outcome(steps=result.steps_computed, cpu_s=cpu_s, checkpoint_bytes=result.checkpoint_bytes,
                   final_loss=validation_loss(model, test, None, torch.device("cpu")), stopped_by=result.stopped_by)


def compare(regime: str, sizes: tuple[int, int, str], control: ControlConfig, runs: dict[str, tuple[float, str]]) -> None:
    """Every run of `runs`, fixed vs controlled, in one regime; print the table and the ratios."""
    train_bytes, budget, what = sizes
    train, held_out = corpus(train_bytes)
    validation = [batch_of(windows(held_out, 10_000 + i, BATCH), i) for i in range(control.eval_batches)]
    test = [batch_of(windows(held_out, 20_000 + i, BATCH), i) for i in range(32)]
    print(f"\ncontrol savings, regime {regime}: {train_bytes // 1000} kB of training data, budget {budget} steps ({what}):")
    print(f"{'run':<10} {'kind':<22} {'steps fixed/ctl':>16} {'CPU-s fixed/ctl':>16} {'ckpt MB fixed/ctl':>18} {'loss fixed/ctl':>16} {'diff':>7}  stopped by")
    totals = {"steps": [0, 0], "cpu": [0.0, 0.0], "bytes": [0, 0]}
    worst = -1.0
    with tempfile.TemporaryDirectory() as tmp:
        for name, (lr, kind) in runs.items():
            fixed = train_one(Path(tmp) / f"fixed-{name}", train, validation, test, lr, budget, None)
            ctl = train_one(Path(tmp) / f"ctl-{name}", train, validation, test, lr, budget, control)
            diff = (ctl.final_loss - fixed.final_loss) / fixed.final_loss
            worst = max(worst, diff)
            for key, a, b in (("steps", fixed.steps, ctl.steps), ("cpu", fixed.cpu_s, ctl.cpu_s), ("bytes", fixed.checkpoint_bytes, ctl.checkpoint_bytes)):
                totals[key][0] += a
                totals[key][1] += b
            print(f"{name:<10} {kind:<22} {fixed.steps:>7} / {ctl.steps:<6} {fixed.cpu_s:>7.1f} / {ctl.cpu_s:<6.1f} "
                  f"{fixed.checkpoint_bytes / 1e6:>8.1f} / {ctl.checkpoint_bytes / 1e6:<7.1f} {fixed.final_loss:>7.3f} / {ctl.final_loss:<6.3f} "
                  f"{diff:>+6.1%}  {ctl.stopped_by or '-'}", flush=True)
    print(f"  compute fixed / controlled = {totals['steps'][0] / totals['steps'][1]:.2f}x in steps, "
          f"{totals['cpu'][0] / totals['cpu'][1]:.2f}x in CPU-seconds (goal >= 3x)")
    print(f"  checkpoint bytes fixed / controlled = {totals['bytes'][0] / max(1, totals['bytes'][1]):.2f}x (goal >= 2x)")
    print(f"  worst final-loss change {worst:+.1%} (goal: every run within +5%)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("regimes", nargs="*", help=f"the regimes to run: {', '.join(REGIMES)} (default: all)", metavar="REGIME")
    parser.add_argument("--smoke", action="store_true", help="two short runs in a small regime: checks the bench runs")
    args = parser.parse_args()
    if unknown := [name for name in args.regimes if name not in REGIMES]:
        parser.error(f"unknown regime {unknown[0]!r}; regimes: {', '.join(REGIMES)}")
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING, format="  %(message)s")
    control = load(POLICY).control
    assert control is not None, f"{POLICY} has no control section"
    runs = {name: RUNS[name] for name in SMOKE_RUNS} if args.smoke else RUNS
    regimes = {"smoke": SMOKE_REGIME} if args.smoke else {name: REGIMES[name] for name in args.regimes or REGIMES}
    print(f"control savings: {len(runs)} runs per regime, fixed checkpoints every {FIXED_CHECKPOINT_EVERY} steps; policy {POLICY.name}")
    for regime, sizes in regimes.items():
        compare(regime, sizes, control, runs)


if __name__ == "__main__":
    main()
