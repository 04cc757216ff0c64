"""GRPO step time: the learner sampling for itself vs. one actor process beside it, on this machine's cores.

The same tiny run (a model taught the answer format for a few steps, 8 tasks x 8 samples a step)
three ways, side by side: colocated (one process samples, scores and learns); one learner + one
actor pushing weights after every update (the actor waits for each update); and one learner + one
actor pushing every 2 updates (the actor samples the next batch while the learner updates, one
version behind). Prints seconds per step, the ratios, and what a weight push costs. `--smoke`: a few short steps of
the first two ways (the third runs the same code of this bench), to check the bench runs.
"""

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.post.test_rl import MODEL, ROWS, fine_tuned, tokenizer  # noqa: E402  (the tests' tiny task set and model)

from factory.config.schema import RLConfig  # noqa: E402
from factory.post.rl import train_rl  # noqa: E402
from factory.post.weightsync import roles_from  # noqa: E402

STEPS = 12
SMOKE = (3, 2, 2)
"""Steps, prompts per step and samples per prompt of `--smoke`: the fewest steps that leave one after the two `per_step`
leaves out, and a few sandboxed executions a step instead of 64."""
LOG = logging.getLogger("bench-rl")


def config(sizes: tuple[int, int, int], actors: int, sync_every: int) -> RLConfig:
    steps, prompts, group = sizes
    return RLConfig(steps=steps, prompts_per_step=prompts, group_size=group, lr=1e-3, max_new_tokens=8, log_every=1, actors=actors,
                    sync_every=sync_every, sandbox_seconds=2.0)


def run(work: Path, sizes: tuple[int, int, int], rank: int, actors: int, sync_every: int) -> None:
    tok = tokenizer()
    init = torch.load(work.parent / "init.pt", weights_only=True)
    train_rl(ROWS * 4, tok, 0, init, MODEL, config(sizes, actors, sync_every), 5, roles_from(rank, 1, actors), work, LOG)


def _rank(rank: int, port: int, work: str, sizes: tuple[int, int, int], sync_every: int) -> None:
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=300))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    run(Path(work), sizes, rank, 1, sync_every)
    dist.destroy_process_group()
    os._exit(0)


def split(work: Path, sizes: tuple[int, int, int], sync_every: int) -> None:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    mp.spawn(_rank, args=(store.port, str(work), sizes, sync_every), nprocs=2)


def per_step(work: Path) -> tuple[float, float]:
    """Median seconds per step (the first two steps left out: start-up) and mean push seconds."""
    rows = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()][2:]
    steps = sorted(row["step_seconds"] for row in rows)
    return steps[len(steps) // 2], sum(row["sync_seconds"] for row in rows) / len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE[0]} short steps each: checks the bench runs")
    smoke = parser.parse_args().smoke
    sizes = SMOKE if smoke else (STEPS, 8, 8)
    ways = {
        "colocated": lambda w: run(w, sizes, 0, 0, 1),
        "1 learner + 1 actor, push every update": lambda w: split(w, sizes, 1),
        "1 learner + 1 actor, push every 2 updates": lambda w: split(w, sizes, 2),
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        torch.save(fine_tuned(tokenizer()), root / "init.pt")
        timings = {}
        for name, action in list(ways.items())[: 2 if smoke else None]:
            started = time.perf_counter()
            action(root / name.replace(" ", "_"))
            timings[name] = per_step(root / name.replace(" ", "_"))
            print(f"{name}: {timings[name][0]:.3f} s/step (median), push {timings[name][1] * 1000:.1f} ms, "
                  f"whole run {time.perf_counter() - started:.1f} s")
        base = timings["colocated"][0]
        for name, (seconds, _) in timings.items():
            print(f"ratio {name} / colocated: {seconds / base:.2f}x")


if __name__ == "__main__":
    main()
