"""Evaluate many `evaluations` partitions in few runs: partition ranges of up to EVALS_PER_RUN checkpoints.

`python -m assets.backfill --benchmark NAME [--root DIR]` adds the benchmark's partition and
evaluates every recorded checkpoint on it, in process (no daemon needed); `factory evals backfill`
calls it. The same ranges are what the Dagster UI's backfill and the automation sensor produce
from the asset's backfill policy.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from dagster import DagsterInstance, ExecuteInProcessResult, MultiPartitionKey, PreviewWarning

from assets.evaluations import EVALS_PER_RUN, evaluated
from assets.execution import EVERYTHING, RUN_CONFIG, failure_messages, gate_refused, materialize, resources_at
from assets.partitions import BENCHMARKS, CHECKPOINTS
from assets.records import latest_metadata_by_partition
from factory.collector import collector_paused
from factory.config.fingerprint import code_identity
from factory.errors import ConfigError
from factory.registry import Registry
from factory.evals.benchmarks import benchmark

RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"


def ranges(order: Iterable[str], wanted: set[str], limit: int = EVALS_PER_RUN) -> Iterator[tuple[str, str]]:
    """(first, last) of each run: stretches of consecutive wanted checkpoints (in partition order), at most `limit` long."""
    run: list[str] = []
    for key in order:
        if key in wanted and len(run) < limit:
            run.append(key)
            continue
        if run:
            yield run[0], run[-1]
        run = [key] if key in wanted else []
    if run:
        yield run[0], run[-1]


def stored_checkpoints(instance: DagsterInstance, experiment: str | None = None) -> set[str]:
    """Checkpoint partitions (of one experiment, or all) whose bytes are still where they were recorded: on this disk, or
    in a published artifact in the object store (immutable: its prefix is not looked at)."""
    keys = [key for key in instance.get_dynamic_partitions(CHECKPOINTS) if experiment is None or key.rsplit("__", 1)[0] == experiment]
    recorded = latest_metadata_by_partition(instance, CHECKPOINTS, keys, labels=("path", "stored"))
    return {key for key in keys if (metadata := recorded.get(key)) and _stored(metadata)}


def _stored(metadata: dict) -> bool:
    path = metadata.get("path")
    if not path:
        return False
    return metadata.get("stored") == "artifact" if "://" in path else Path(path).exists()


def unevaluated(instance: DagsterInstance, registry: Registry, benchmarks: Iterable[str], checkpoints: set[str]) -> set[str]:
    """The checkpoints with an evaluation on some of `benchmarks` that is not in the registry: the others need no run."""
    names = list(dict.fromkeys(benchmarks))
    if not all(instance.has_dynamic_partition(BENCHMARKS, name) for name in names):
        return set(checkpoints)  # a benchmark with no partitions yet: nothing is evaluated on it
    code = code_identity("local")
    with collector_paused():  # thousands of records read, as many items made of them and looked up
        recorded = latest_metadata_by_partition(instance, CHECKPOINTS, checkpoints)
        return {checkpoint for checkpoint in checkpoints if not all(
            evaluated(registry, code, name, checkpoint, recorded.get(checkpoint)) for name in names
        )}


def evaluate_checkpoints(
    instance: DagsterInstance, benchmarks: Iterable[str], checkpoints: set[str], run: Callable[..., ExecuteInProcessResult],
    limit: int = EVALS_PER_RUN,
) -> list[ExecuteInProcessResult]:
    """Evaluate `checkpoints` on `benchmarks`, one run per range of at most `limit` partitions; stops at the first failed run.

    A range spans benchmarks too (from the first to the last wanted one, in partition order): every
    benchmark in between is evaluated as well, as the asset's partitions say it should be.
    """
    new = [name for name in benchmarks if not instance.has_dynamic_partition(BENCHMARKS, name)]
    if new:
        instance.add_dynamic_partitions(BENCHMARKS, new)
    order = instance.get_dynamic_partitions(BENCHMARKS)
    span = sorted(order.index(name) for name in benchmarks)
    if not span:
        return []
    low, high = order[span[0]], order[span[-1]]
    per_run = max(1, limit // (span[-1] - span[0] + 1))
    results = []
    for first, last in ranges(instance.get_dynamic_partitions(CHECKPOINTS), checkpoints, per_run):
        tags = {
            RANGE_START: str(MultiPartitionKey({"benchmark": low, "checkpoint": first})),
            RANGE_END: str(MultiPartitionKey({"benchmark": high, "checkpoint": last})),
        }
        results.append(run(selection=["evaluations"], tags=tags))
        if not results[-1].success:
            break
    return results


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit 0 ok, 1 an evaluation failed, 2 bad input."""
    parser = argparse.ArgumentParser(prog="python -m assets.backfill")
    parser.add_argument("--benchmark", required=True)
    parser.add_argument("--root", type=Path, default=Path(".factory"))
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=PreviewWarning)
    try:
        benchmark(args.benchmark)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    instance = DagsterInstance.get()
    checkpoints = stored_checkpoints(instance)
    if not checkpoints:
        print(f"no stored checkpoints recorded in {instance.root_directory}: run an experiment first", file=sys.stderr)
        return 1
    if gone := len(instance.get_dynamic_partitions(CHECKPOINTS)) - len(checkpoints):
        print(f"{gone} recorded checkpoints were deleted by their run's retention policy; they are not evaluated")

    def run(**options) -> ExecuteInProcessResult:
        return materialize(EVERYTHING, instance=instance, resources=resources_at(args.root), raise_on_error=False, run_config=RUN_CONFIG, **options)

    results = evaluate_checkpoints(instance, [args.benchmark], checkpoints, run)
    for result in results:
        if not result.success:
            for message in failure_messages(result):
                print(f"error: {message}", file=sys.stderr)
            return 1
    runs = f"{len(results)} run" if len(results) == 1 else f"{len(results)} runs"
    print(f"{args.benchmark}: {len(checkpoints)} checkpoints evaluated in {runs} of up to {EVALS_PER_RUN} partitions")
    board = run(selection=["leaderboard", "best_model"])
    for message in failure_messages(board):
        print(f"{'note' if gate_refused(board) else 'error'}: {message}", file=sys.stderr)
    return 0 if board.success or gate_refused(board) else 1


if __name__ == "__main__":
    sys.exit(main())
