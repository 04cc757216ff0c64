"""GRPO step time: the learner sampling for itself vs. one actor process beside it, on this machine's cores.

The same tiny run (a model taught the answer format for a few steps, 8 tasks x 8 samples a step)
three ways, side by side: colocated (one process samples, scores and learns); one learner + one
actor pushing weights after every update (the actor waits for each update); and one learner + one
actor pushing every 2 updates (the actor samples the next batch while the learner updates, one
version behind). Prints seconds per step, the ratios, and what a weight push costs. `--smoke`: a few short steps of
the first two ways (the third runs the same code of this bench), to check the bench runs. `--devices cpu,cuda`: each
way on the CPU and then with the learner and actor on the GPU (one GPU: both ranks on it, over gloo), and the GPU / CPU
ratio of each. The two processes of a split way compute on half the cores each: without that, on a 16-core machine
the way whose actor samples while the learner updates took 5.5x the colocated step, most likely 32 threads on 16 cores.
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


def run(work: Path, sizes: tuple[int, int, int], rank: int, actors: int, sync_every: int, device: str = "cpu") -> None:
    tok = tokenizer()
    init = torch.load(work.parent / "init.pt", weights_only=True)
    train_rl(ROWS * 4, tok, 0, init, MODEL, config(sizes, actors, sync_every), 5, roles_from(rank, 1, actors), work, LOG,
             device=torch.device(device))


def _rank(rank: int, port: int, work: str, sizes: tuple[int, int, int], sync_every: int, device: str) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))  # the learner and the actor share the cores, not each take all
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=300))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)  # on one GPU too: gloo moves CUDA tensors
    run(Path(work), sizes, rank, 1, sync_every, device)
    dist.destroy_process_group()
    os._exit(0)


def split(work: Path, sizes: tuple[int, int, int], sync_every: int, device: str) -> None:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    mp.spawn(_rank, args=(store.port, str(work), sizes, sync_every, device), nprocs=2)


def per_step(work: Path) -> tuple[float, float]:
    """Median seconds per step (the first two steps left out: start-up) and mean push seconds."""
    rows = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()][2:]
    steps = sorted(row["step_seconds"] for row in rows)
    return steps[len(steps) // 2], sum(row["sync_seconds"] for row in rows) / len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE[0]} short steps each: checks the bench runs")
    parser.add_argument("--devices", default="cpu", help="cpu, cuda, or cpu,cuda: where the learner and actor compute")
    args = parser.parse_args()
    sizes = SMOKE if args.smoke else (STEPS, 8, 8)
    devices = args.devices.split(",")
    ways = {
        "colocated": lambda w, d: run(w, sizes, 0, 0, 1, d),
        "1 learner + 1 actor, push every update": lambda w, d: split(w, sizes, 1, d),
        "1 learner + 1 actor, push every 2 updates": lambda w, d: split(w, sizes, 2, d),
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        torch.save(fine_tuned(tokenizer()), root / "init.pt")
        timings: dict[tuple[str, str], tuple[float, float]] = {}
        for device in devices:
            for name, action in list(ways.items())[: 2 if args.smoke else None]:
                started = time.perf_counter()
                work = root / f"{device}-{name.replace(' ', '_')}"
                action(work, device)
                timings[(device, name)] = per_step(work)
                print(f"{device} {name}: {timings[(device, name)][0]:.3f} s/step (median), push {timings[(device, name)][1] * 1000:.1f} ms, "
                      f"whole run {time.perf_counter() - started:.1f} s")
        for device in devices:
            base = timings[(device, "colocated")][0]
            for (where, name), (seconds, _) in timings.items():
                if where == device:
                    print(f"ratio {device} {name} / colocated: {seconds / base:.2f}x")
        if len(devices) == 2:
            for (where, name), (seconds, _) in timings.items():
                if where == devices[1]:
                    print(f"ratio {name}: {devices[1]} / {devices[0]} = {seconds / timings[(devices[0], name)][0]:.2f}x")


if __name__ == "__main__":
    main()
