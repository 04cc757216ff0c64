"""FSDP vs DDP through the factory trainer, side by side in one run (`make bench`; `--device cuda`: a GPU per rank).

Every figure comes from `factory.train.pretrain.pretrain` run as users run it: ranks under torchrun (gloo on the CPU,
nccl on GPUs), sharded checkpoints, the same global batches (sequences counting from seeded random starts) whatever
the world size.

1. Peak memory per rank, FSDP on 2 ranks vs DDP on 2 ranks, on a model whose weights and optimizer state dominate (wide,
   `GLOBAL_BATCH` x `CONTEXT` tokens a step). On the CPU: each rank's peak resident set (ru_maxrss), in total and above a
   baseline taken in the same process after torch is imported and the process group is up, before the model is built
   (the baseline is torch's own libraries and gloo's buffers, the same whatever the model). On the CPU each comparison
   runs twice: under glibc's malloc as the trainer sets it (`factory/train/heap.py`: under DDP freed memory is kept and
   buffers up to 32 MiB come from the heap; under FSDP buffers over 1 MiB are mapped, so the full-size blocks its
   collectives gather and free every block go back to the OS), and with buffers over 1 MiB mapped on both sides. On a GPU: `torch.cuda.max_memory_allocated`.
   Goal: FSDP <= 0.6x DDP.
2. Tokens/s FSDP / DDP on 2 ranks, from the same runs (steps after `WARMUP_STEPS`, rank 0's clock).
3. Resharding load time: a checkpoint written by 2 ranks resumed on 1 (and one written by 1 resumed on 2), vs a load of the
   same size that does not reshard: a checkpoint resumed on the world size that wrote it (the other writer's on the same
   world, and the same checkpoint on its own world); the time inside the trainer from reading the latest checkpoint
   (checksum included) to the state restored into the (sharded) model, slowest rank.
4. The loss curves of `Sizes.steps` steps on FSDP-2, DDP-2 and 1 rank: the largest difference between them.

Runs alternate (FSDP, DDP, FSDP, ...) and each ratio is taken within a round, so a noisy neighbour hurts both sides alike;
the median and the range over rounds are printed. `--smoke`: a narrow model, a few steps, one round, malloc as the trainer
sets it, FSDP and DDP on 2 ranks and their checkpoint resumed on 1, to check the bench runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VOCAB = 8192
MODEL = {"n_layer": 4, "n_head": 8, "n_embd": 768, "context": 32}
"""Wide and shallow, a short context: weights, gradients and AdamW's two moments dwarf the activations."""
CONTEXT = MODEL["context"]
GLOBAL_BATCH = 4
"""Sequences a step over all ranks (2 per rank on 2 ranks)."""
LR = 3e-4
WARMUP_STEPS = 3
"""Steps left out of tokens/s: the first ones pay for lazy initialisation and the first gathers."""
TRAINER = "trainer"
ALLOCATORS = {
    TRAINER: ({}, "glibc's malloc as the trainer sets it (factory/train/heap.py: DDP keeps freed memory and serves buffers up to "
              "32 MiB from the heap; FSDP maps buffers over 1 MiB)"),
    "mmapped": ({"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}, "buffers over 1 MiB mmapped, so freed back to the OS (MALLOC_MMAP_THRESHOLD_; "
                "the trainer then leaves malloc alone)"),
}
"""The malloc settings memory is measured under (CPU): what the trainer runs with, and the one that explains the difference."""
LOG = logging.getLogger("bench.fsdp")
RESUMES = ((2, 1), (1, 1), (1, 2), (2, 2))
"""(written by, resumed on): each resharded load, then its same-size reference."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Sizes:
    """The model, steps and rounds of the measures."""

    n_layer: int = MODEL["n_layer"]
    n_embd: int = MODEL["n_embd"]
    steps: int = 20
    rounds: int = 2
    load_rounds: int = 3
    allocators: tuple[str, ...] = tuple(ALLOCATORS)
    resumes: tuple[tuple[int, int], ...] = RESUMES
    one_rank: bool = True
    """Whether a run on one rank joins the loss curves (and writes the checkpoint a resume from 1 rank reads)."""

    def model(self) -> dict[str, int]:
        return {**MODEL, "n_layer": self.n_layer, "n_embd": self.n_embd}


SMOKE = Sizes(n_layer=1, n_embd=32, steps=WARMUP_STEPS + 3, rounds=1, load_rounds=1, allocators=(TRAINER,), resumes=RESUMES[:1],
              one_rank=False)
"""Every function of the bench once, in the fewest processes (seven, each importing torch): FSDP-2 and DDP-2, and the
2-rank checkpoint resumed on one rank, without its reference or a one-rank training."""


def config_for(parallelism: str, steps: int) -> Any:
    """The pretrain section of every run: sharded checkpoints (FSDP needs them; DDP writes them too), fp32, every step logged."""
    from factory.config.schema import PretrainConfig

    return PretrainConfig(steps=steps, batch_size=GLOBAL_BATCH, lr=LR, warmup_steps=2, checkpoint_every=0, log_every=1,
                          checkpoint_format="sharded", parallelism=parallelism, precision="fp32")


def data_for(rank: int, ranks: int) -> Any:
    """This rank's slice of the same seeded global batches, from a position on (the trainer's batch source)."""
    import torch

    from factory.data.loader import Batch, LoaderState

    share = GLOBAL_BATCH // ranks

    def batches(state: LoaderState | None) -> Iterator[Batch]:
        step = state.slot if state else 0
        while True:
            starts = torch.randint(0, VOCAB, (GLOBAL_BATCH, 1), generator=torch.Generator().manual_seed(step))
            seqs = (starts + torch.arange(CONTEXT + 1)) % 64  # counting modulo 64 from a random start: learnt within the steps
            mine = seqs[rank * share : (rank + 1) * share]
            step += 1
            yield Batch(x=mine[:, :-1].clone(), y=mine[:, 1:].clone(), documents=(), state=LoaderState(slot=step),
                        real_tokens=mine[:, 1:].numel(), global_tokens=GLOBAL_BATCH * CONTEXT)

    return batches


@contextlib.contextmanager
def timed_loads() -> Iterator[list[float]]:
    """The seconds the trainer spends in `resume`: finding the latest good checkpoint (each rank checksums its share),
    reading it (under FSDP, each rank its own shards) and restoring it into the (sharded) model and optimizer."""
    import factory.train.pretrain as trainer

    spent: list[float] = []
    resume = trainer.resume

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return resume(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - started)

    trainer.resume = timed  # type: ignore[assignment]
    try:
        yield spent
    finally:
        trainer.resume = resume  # type: ignore[assignment]


def worker(spec: dict[str, Any]) -> None:
    """One rank of a run (under torchrun, or alone): train or resume in `work`, and write what it measured to `out`."""
    import psutil
    import torch

    from factory.config.schema import ModelConfig
    from factory.train.distributed import join, leave, world_from_env
    from factory.train.pretrain import pretrain

    world = world_from_env()
    join(world)
    baseline = psutil.Process().memory_info().rss  # torch, the trainer's imports and the process group; no model yet
    device = world.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    stamps: list[float] = []
    peaks: list[float] = []  # the peak RSS so far at each step, after its backward (before the final save)

    def stepped(done: int, loss: float, speed: float) -> None:
        stamps.append(time.perf_counter())
        peaks.append(peak_rss_mb())

    with timed_loads() as loads:
        config = config_for(spec["parallelism"], spec["steps"])
        result = pretrain(data_for(world.rank, world.size), VOCAB, ModelConfig(**spec["model"]), config, 0, Path(spec["work"]), LOG,
                          world=world, on_step=stepped)
    record = {
        "rank": world.rank, "baseline_mb": baseline / 2**20, "peak_mb": peak_rss_mb(), "step_peaks_mb": peaks,
        "gpu_peak_mb": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
        "load_seconds": sum(loads), "loads": len(loads), "stamps": stamps, "parameters": result.parameters, "device": str(device),
    }
    Path(spec["out"], f"rank{world.rank}.json").write_text(json.dumps(record))
    leave(world)


def peak_rss_mb() -> float:
    """This process's peak resident set so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def run(work: Path, ranks: int, parallelism: str, device: str, sizes: Sizes, malloc: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Train (or, with a checkpoint of the last step in `work`, resume) on `ranks` ranks; every rank's record."""
    from factory.launch.local import RANK_LOGS_ENV

    out = work.parent / f"{work.name}-out"
    out.mkdir(parents=True)
    spec = work.parent / f"{work.name}.json"
    spec.write_text(json.dumps({"work": str(work), "parallelism": parallelism, "out": str(out), "model": sizes.model(),
                                "steps": sizes.steps}))
    prefix = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    threads = max(1, (os.cpu_count() or 1) // ranks)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(threads), **({"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {}),
           RANK_LOGS_ENV: str(work.parent / f"{work.name}-logs"), **(malloc or {})}  # torchrun's logs: with the run's, not in a temp dir of its own
    done = subprocess.run([*prefix, __file__, "--worker", str(spec)], env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise SystemExit(f"{parallelism} on {ranks} rank(s) failed:\n{done.stderr[-4000:]}")
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(ranks)]


def losses(work: Path) -> list[float]:
    """The loss of every step, as rank 0 logged it."""
    from factory.registry.layout import METRICS_FILE

    return [json.loads(line)["loss"] for line in (work / METRICS_FILE).read_text().splitlines()]


def tokens_per_second(ranks: list[dict[str, Any]]) -> float:
    """Global tokens/s of a run after its warm-up steps, by rank 0's clock."""
    stamps = ranks[0]["stamps"][WARMUP_STEPS:]
    return GLOBAL_BATCH * CONTEXT * (len(stamps) - 1) / (stamps[-1] - stamps[0])


def spread(values: list[float]) -> str:
    """A ratio over rounds: its median and range."""
    return f"{statistics.median(values):.3f} median (range {min(values):.3f}-{max(values):.3f}, {len(values)} rounds)"


def compare(tmp: Path, device: str, allocator: str, sizes: Sizes) -> dict[str, list[list[dict[str, Any]]]]:
    """FSDP-2 and DDP-2, alternating, under one setting of glibc's malloc; prints memory and throughput; every run's ranks."""
    sides: dict[str, list[list[dict[str, Any]]]] = {"fsdp": [], "ddp": []}
    for round_ in range(sizes.rounds):
        for parallelism, side in sides.items():
            side.append(run(tmp / f"{allocator}-{parallelism}2-{round_}" / "work", 2, parallelism, device, sizes, ALLOCATORS[allocator][0]))
    for ranks in (ranks for side in sides.values() for ranks in side):
        for rank in ranks:
            rank["above"] = rank["peak_mb"] - rank["baseline_mb"]
    gpu = sides["fsdp"][0][0]["gpu_peak_mb"] is not None
    print(f"fsdp: -- {ALLOCATORS[allocator][1] if not gpu else 'GPU memory'}")
    measures = [("gpu_peak_mb", "GPU max_memory_allocated")] if gpu else [("peak_mb", "peak RSS"), ("above", "peak RSS above baseline")]
    for key, what in measures:
        for parallelism, side in sides.items():
            per_rank = [statistics.median(ranks[r][key] for ranks in side) for r in range(2)]
            print(f"fsdp: {what} per rank, {parallelism.upper()} on 2 ranks: {per_rank[0]:,.0f} / {per_rank[1]:,.0f} MB "
                  f"(median of {sizes.rounds})")
        ratios = [max(r[key] for r in f) / max(r[key] for r in d) for f, d in zip(sides["fsdp"], sides["ddp"])]
        print(f"fsdp: FSDP / DDP {what} (largest rank) = {spread(ratios)} (goal <= 0.6)")
    if not gpu:
        for parallelism, side in sides.items():  # where the peak is reached: building, the first update, training, the final save

            def above(at: int, side: list = side) -> float:
                return statistics.median(max(r["step_peaks_mb"][at] - r["baseline_mb"] for r in ranks) for ranks in side)

            end = statistics.median(max(r["above"] for r in ranks) for ranks in side)
            print(f"fsdp: {parallelism.upper()} peak RSS above baseline (largest rank) by the backward of step 1: {above(0):,.0f} MB, "
                  f"of step 2 (after the first AdamW update): {above(1):,.0f}, of step {sizes.steps}: {above(-1):,.0f}; at the end "
                  f"(the last update and the final sharded save): {end:,.0f}")
    speeds = [tokens_per_second(f) / tokens_per_second(d) for f, d in zip(sides["fsdp"], sides["ddp"])]
    print(f"fsdp: tokens/s FSDP {statistics.median(tokens_per_second(f) for f in sides['fsdp']):,.0f}, "
          f"DDP {statistics.median(tokens_per_second(d) for d in sides['ddp']):,.0f} on 2 ranks; FSDP / DDP = {spread(speeds)}")
    return sides


def train_side_by_side(tmp: Path, device: str, sizes: Sizes) -> dict[int, Path]:
    """Memory and throughput under each malloc setting (one on a GPU), one rank once (`sizes.one_rank`), and the loss
    curves; the work directories whose final checkpoints were written by 2 ranks and by 1."""
    from factory.config.schema import ModelConfig
    from factory.models.build import build_model, count_parameters

    parameters = count_parameters(build_model(ModelConfig(**sizes.model()), VOCAB, 0))
    print(f"fsdp: {parameters / 1e6:.1f}M parameters ({parameters * 4 / 2**20:.0f} MB of fp32 weights; gradients the same, AdamW's "
          f"moments twice that), {GLOBAL_BATCH} x {CONTEXT} tokens a step, {sizes.steps} steps, {'2 GPUs' if device == 'cuda' else 'on the CPU'}")
    for allocator in sizes.allocators if device == "cpu" else [TRAINER]:
        sides = compare(tmp, device, allocator, sizes)
        if device == "cpu" and allocator == TRAINER:
            print(f"fsdp: baseline RSS {statistics.median(r['baseline_mb'] for ranks in sides['fsdp'] for r in ranks):,.0f} MB per rank "
                  "before the model is built (torch, the trainer's imports, the process group)")
    works = {name: tmp / f"{TRAINER}-{name}2-0" / "work" for name in ("fsdp", "ddp")}
    curves = {"FSDP-2": losses(works["fsdp"]), "DDP-2": losses(works["ddp"])}
    written = {2: works["fsdp"]}
    if sizes.one_rank:
        written[1] = tmp / "one" / "work"
        run(written[1], 1, "fsdp", device, sizes)
        curves["1 rank"] = losses(written[1])
    assert all(len(curve) == sizes.steps for curve in curves.values())
    names = list(curves)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            print(f"fsdp: loss curves over {sizes.steps} steps, {a} vs {b}: max |difference| = "
                  f"{max(abs(x - y) for x, y in zip(curves[a], curves[b])):.2e} (losses {curves[a][0]:.4f} -> {curves[a][-1]:.4f})")
    return written


def resume_side_by_side(tmp: Path, written: dict[int, Path], device: str, sizes: Sizes) -> None:
    """Each checkpoint resumed on the other world size and on its own, alternating; the load time of the slowest rank."""
    seconds: dict[tuple[int, int], list[float]] = {case: [] for case in sizes.resumes}
    for round_ in range(sizes.load_rounds):
        for by, on in sizes.resumes:
            work = tmp / f"load-{by}to{on}-{round_}" / "work"
            shutil.copytree(written[by], work)
            ranks = run(work, on, "fsdp", device, sizes)
            assert all(r["loads"] == 1 for r in ranks), "one resume per rank"
            seconds[(by, on)].append(max(r["load_seconds"] for r in ranks))
    size_mb = sum(p.stat().st_size for p in written[2].rglob("*") if p.is_file()) / 2**20
    print(f"fsdp: resuming a {size_mb:,.0f} MB sharded checkpoint (the final one, {sizes.steps} steps) takes, slowest rank:")
    for by, on in sizes.resumes:
        print(f"fsdp:   written by {by}, resumed on {on}: {statistics.median(seconds[(by, on)]):.2f} s (median of {sizes.load_rounds})")
    for resharded, same in (((2, 1), (1, 1)), ((1, 2), (2, 2)), ((2, 1), (2, 2)), ((1, 2), (1, 1))):
        if resharded not in seconds or same not in seconds:
            continue
        ratios = [a / b for a, b in zip(seconds[resharded], seconds[same])]
        print(f"fsdp: load {resharded[0]} -> {resharded[1]} ranks / {same[0]} -> {same[1]} = {spread(ratios)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: a GPU per rank when there are 2, else the CPU")
    parser.add_argument("--smoke", action="store_true", help="a narrow model, a few steps, one round: checks the bench runs")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = SMOKE if args.smoke else Sizes()
    if args.worker is not None:
        worker(json.loads(args.worker.read_text()))
        return
    device = args.device
    if device != "cpu":
        import torch

        gpus = torch.cuda.device_count()
        if gpus < 2 and device == "cuda":
            raise SystemExit(f"--device cuda needs a GPU per rank (2), this machine has {gpus}")
        device = "cuda" if gpus >= 2 else "cpu"
    with tempfile.TemporaryDirectory(prefix="bench-fsdp-") as tmp:
        resume_side_by_side(Path(tmp), train_side_by_side(Path(tmp), device, sizes), device, sizes)


if __name__ == "__main__":
    main()
