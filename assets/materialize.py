"""One experiment file materialized in process: its stages per variant, its due evaluations, the leaderboard, its reports."""

import os
import sys
from pathlib import Path

from dagster import AssetKey, DagsterInstance, ExecuteInProcessResult
from rich.console import Console
from rich.table import Table

from assets.backfill import evaluate_checkpoints, stored_checkpoints, unevaluated
from assets.execution import EVERYTHING, RUN_CONFIG, failure_messages, gate_refused, logged_to, materialize, resources_at
from assets.partitions import CHECKPOINTS, EXPERIMENTS
from assets.stages import base_tags
from factory.config import Experiment
from factory.config.stages import stages_of
from factory.ops.bases import resolve
from factory.registry import open_registry


def materialize_experiment(
    path: Path, experiments: list[Experiment], root: Path, instance: DagsterInstance, quiet: bool = False, log: Path | None = None
) -> ExecuteInProcessResult:
    """Materialize every stage of every experiment the file defines, evaluate its checkpoints, then the leaderboard and reports;
    with `log`, every run's log goes to that file too (the terminal gets no stack trace)."""
    common = {"instance": instance, "resources": resources_at(root, path.parent), "raise_on_error": False,
              "run_config": RUN_CONFIG if log is None else logged_to(log)}
    registry = open_registry(root / "registry")
    for experiment in experiments:
        result = materialize_stages(experiment, common)
        if not result.success:
            return result
        if not quiet:
            print_stages(experiment, result)
        if experiment.eval is not None:  # only checkpoints with an evaluation not in the registry yet: a rerun starts no run here
            due = unevaluated(instance, registry, experiment.eval.benchmarks, stored_checkpoints(instance, experiment.name))
            for result in evaluate_checkpoints(instance, experiment.eval.benchmarks, due,
                                               lambda **options: materialize(EVERYTHING, **options, **common)):
                if not result.success:
                    return result
    board = materialize(EVERYTHING, selection=["leaderboard", "best_model"], **common)
    if not board.success and not gate_refused(board):
        return board
    for message in failure_messages(board):  # the best model stays where it is: news, not a failure of this run
        print(f"note: {message}; the best model was not moved", file=sys.stderr)
    for experiment in experiments:
        result = materialize(EVERYTHING, selection=["run_report"], partition_key=experiment.name, **common)
        if not result.success:
            return result
        for event in result.get_asset_materialization_events():
            if page := event.materialization.metadata.get("report"):
                print(f"run report of {experiment.name}: {page.value}", file=sys.stderr)
    return result


def materialize_stages(experiment: Experiment, common: dict) -> ExecuteInProcessResult:
    """One run over the stages of one experiment partition."""
    instance: DagsterInstance = common["instance"]
    if not instance.has_dynamic_partition(EXPERIMENTS, experiment.name):
        instance.add_dynamic_partitions(EXPERIMENTS, [experiment.name])
    base = resolve(experiment, common["resources"]["stores"].registry())  # pinned once: every stage of the run starts from it
    tags = {"experiment": experiment.name, **base_tags(base)}
    return materialize(EVERYTHING, selection=list(stages_of(experiment)), partition_key=experiment.name, tags=tags, **common)


def print_stages(experiment: Experiment, result: ExecuteInProcessResult) -> None:
    """A table of what each stage did: computed or reused, and where its artifact is."""
    table = Table(title=f"stages of {experiment.name}", title_justify="left")
    for column in ("asset", "cache", "artifact"):
        table.add_column(column, no_wrap=True)
    for event in result.get_asset_materialization_events():
        materialization = event.materialization
        if materialization.asset_key == AssetKey(CHECKPOINTS):
            continue  # many per run; the training stage's log counts them
        metadata = {key: value.value for key, value in materialization.metadata.items()}
        computed = "reused" if metadata.get("cache") == "hit" else "computed"
        artifact = metadata.get("artifact", "")
        if artifact and "://" not in artifact:  # a directory here, not an object store's prefix
            artifact = os.path.relpath(artifact)
        table.add_row(materialization.asset_key.to_user_string(), computed, artifact)
    Console(stderr=True, width=None if sys.stderr.isatty() else 160).print(table)
