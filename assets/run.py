"""`python -m assets.run EXPERIMENT.md [--root DIR]`: materialize one experiment end to end, in process.

A sweep file runs every variant. `factory run` calls this through a subprocess, so the
`factory` library never imports Dagster. When the plan computes something, stages fork from a
warm interpreter (`factory.launch.warm`) started before Dagster is even imported, so that its
imports and Dagster's overlap; the Dagster part is `assets.materialize`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from factory.config import Experiment, load_file
from factory.errors import ConfigError
from factory.launch import warm_starts
from factory.registry import ArtifactStore
from factory.stages import warm_modules
from factory.stages.plan import build_plan
from factory.stages.report import exit_now
from factory.track.base import TrackingConfig

if TYPE_CHECKING:
    from dagster import DagsterInstance, ExecuteInProcessResult


def run_experiment(path: Path, root: Path, instance: DagsterInstance | None = None, quiet: bool = False) -> ExecuteInProcessResult:
    """Materialize every stage of every experiment the file defines, evaluate its checkpoints, then the leaderboard;
    on `instance`, or on $DAGSTER_HOME's (opened and closed here)."""
    experiments = load_file(path)
    with warm_stages(experiments, root):  # the warm interpreter imports while Dagster does, below
        from dagster import DagsterInstance, PreviewWarning

        from assets.materialize import materialize_experiment

        warnings.filterwarnings("ignore", category=PreviewWarning)
        with contextlib.nullcontext(instance) if instance is not None else DagsterInstance.get() as opened:
            return materialize_experiment(path, experiments, root, opened, quiet)


@contextlib.contextmanager
def warm_stages(experiments: list[Experiment], root: Path) -> Iterator[None]:
    """Within the block, stages fork from a warm interpreter started now, when some stage must be computed."""
    try:
        plans = build_plan(experiments, ArtifactStore(root / "registry"))
    except ConfigError:  # e.g. a source directory gone: the stage that cannot be planned fails in Dagster, saying so
        plans = []
    kinds = [plan.kind for plan in plans if plan.status == "run"]
    if kinds:
        with warm_starts(warm_modules(kinds, tracker_backend())):
            yield
    else:
        yield


def tracker_backend() -> str:
    """The tracker the stages will open (a bad setting: none here; the stage that opens it says what to change)."""
    try:
        return TrackingConfig.from_env(os.environ).backend
    except ConfigError:
        return "none"


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit 0 ok, 1 a stage failed, 2 bad input."""
    parser = argparse.ArgumentParser(prog="python -m assets.run")
    parser.add_argument("experiment", type=Path)
    parser.add_argument("--root", type=Path, default=Path(".factory"))
    args = parser.parse_args(argv)
    try:
        result = run_experiment(args.experiment, args.root)  # its instance closed before the fast exit below
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not result.success:
        from assets.execution import failure_messages

        for message in failure_messages(result):
            print(f"error: {message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    exit_now(main())  # every run's events are committed; unloading Dagster module by module would take another second
