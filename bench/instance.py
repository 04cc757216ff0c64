"""The embedded instance (`assets/instance.py`) vs Dagster's own on the same files, side by side in one process: the CPU
and wall time of one in-process run, as `factory run` makes a dozen of them (a variant's stages, each evaluation batch,
the leaderboard, each report).

Two jobs: one asset, and a chain of `CHAIN` assets (more events per run). Each round runs `--runs` runs of a job on each
side, in alternating order, each side on an instance of its own (a fresh root written as `factory` writes it; Dagster's
side with `instance_class` left out of its dagster.yaml, so its default storage and compute logs). CPU is this process's
and its children's (Dagster's compute logs start processes). The medians of the rounds are printed, and the ratio of each
round's figures. `--smoke`: one round of two runs.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
import warnings
from pathlib import Path

from dagster import AssetsDefinition, DagsterInstance, asset, materialize

from factory.cli.common import INSTANCE_CLASS_YAML, dagster_home

CHAIN = 6
QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}
"""Dagster's console logger on errors only: the bench prints its figures."""


@asset
def alone() -> int:
    print("a line on stdout, as a stage's launcher prints")
    return 1


def chain(length: int) -> list[AssetsDefinition]:
    """`length` assets, each taking the one before."""
    links = [alone]
    for number in range(1, length):
        previous = links[-1].key.to_user_string()

        @asset(name=f"link_{number}", deps=[previous])
        def link() -> int:
            return 1

        links.append(link)
    return links


def instance(root: Path, dagsters: bool) -> DagsterInstance:
    """The embedded instance `factory` writes under `root` (`dagsters`: with Dagster's own storage and compute logs)."""
    home = dagster_home(root)
    if dagsters:
        config = home / "dagster.yaml"
        written = config.read_text()
        assert INSTANCE_CLASS_YAML in written, "dagster.yaml names the factory's instance class as factory.cli.common says"
        config.write_text(written.replace(INSTANCE_CLASS_YAML, ""))
    return DagsterInstance.from_config(str(home))


def cpu() -> float:
    """CPU seconds of this process and of its children that ended."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(instance: DagsterInstance, job: list[AssetsDefinition], runs: int) -> tuple[float, float]:
    """CPU and wall seconds per run of `job`, over `runs` runs."""
    cpu_0, wall_0 = cpu(), time.perf_counter()
    for _ in range(runs):
        assert materialize(job, instance=instance, run_config=QUIET).success
    return (cpu() - cpu_0) / runs, (time.perf_counter() - wall_0) / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=20, help="runs of each job on each side per round")
    parser.add_argument("--smoke", action="store_true", help="one round of two runs: checks the bench runs")
    args = parser.parse_args()
    rounds, runs = (1, 2) if args.smoke else (args.rounds, args.runs)
    warnings.filterwarnings("ignore")
    jobs = {"one asset": [alone], f"{CHAIN} assets in a chain": chain(CHAIN)}
    with tempfile.TemporaryDirectory(prefix="bench-instance-") as tmp:
        sides = {"factory": instance(Path(tmp) / "factory", dagsters=False), "dagster": instance(Path(tmp) / "dagster", dagsters=True)}
        for side in sides.values():
            timed(side, [alone], 1)  # each instance's databases created, Dagster's imports done, before any clock
        figures = {(job, side): [] for job in jobs for side in sides}
        for round_ in range(rounds):
            for job, assets in jobs.items():
                for side in (list(sides) if round_ % 2 == 0 else list(reversed(sides))):
                    figures[job, side].append(timed(sides[side], assets, runs))
        for side in sides.values():
            side.dispose()
    print(f"one in-process run, median of {rounds} round(s) of {runs} run(s): CPU s / wall s per run")
    for job in jobs:
        factory, dagster = figures[job, "factory"], figures[job, "dagster"]
        print(f"  {job:22s} factory's instance {median(factory, 0):.3f} / {median(factory, 1):.3f}, "
              f"Dagster's {median(dagster, 0):.3f} / {median(dagster, 1):.3f}")
        for index, what in ((0, "CPU"), (1, "wall")):
            ratios = [theirs[index] / ours[index] for ours, theirs in zip(factory, dagster)]
            print(f"ratio Dagster's instance / the factory's, {what} per run ({job}): {statistics.median(ratios):.2f}x "
                  f"(range {min(ratios):.2f}-{max(ratios):.2f})")


def median(figures: list[tuple[float, float]], index: int) -> float:
    return statistics.median(figure[index] for figure in figures)


if __name__ == "__main__":
    main()
