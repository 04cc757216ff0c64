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
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from factory.config import Experiment, load_file
from factory.errors import ConfigError, Interrupted
from factory.launch import warm_starts
from factory.registry import open_registry
from factory.runtime import tracker_backend, warm_order
from factory.ops.bases import Base, resolve
from factory.ops.plan import build_plan
from factory.launch.ending import exit_now

if TYPE_CHECKING:
    from dagster import DagsterInstance, ExecuteInProcessResult


def run_experiment(
    path: Path, root: Path, instance: DagsterInstance | None = None, quiet: bool = False, log: Path | None = None,
    on_stopped: Callable[[str], None] | None = None,
) -> ExecuteInProcessResult:
    """Materialize every stage of every experiment the file defines, evaluate its checkpoints, then the leaderboard;
    on `instance`, or on $DAGSTER_HOME's (opened and closed here); with `log`, the runs' whole log goes to that file too.
    Runs that died before (this machine's, their process gone) are canceled first, and what they held in the pools freed.
    With `on_stopped`, the runs are watched (`assets.watch.RunWatch`): it says how to go on when one is stopped as it waits."""
    experiments = load_file(path)
    with warm_stages(experiments, root):  # the warm interpreter imports while Dagster does, below
        from dagster import DagsterInstance, PreviewWarning

        warnings.filterwarnings("ignore", category=PreviewWarning)
        from assets.materialize import materialize_experiment
        from assets.watch import RunWatch, reap

        with (contextlib.nullcontext(instance) if instance is not None else DagsterInstance.get() as opened,
              RunWatch(opened, on_stopped) if on_stopped is not None else contextlib.nullcontext()):
            for line in reap(opened):
                print(f"note: {line}", file=sys.stderr)
            for base in pending_bases(experiments, root):  # another experiment's model it starts from is made first
                print(f"{base.section}.from names {base.ref.text}, not computed yet: running {base.file} first", file=sys.stderr)
                result = run_experiment(base.file, root, opened, quiet, log)
                if not result.success:
                    return result
            return materialize_experiment(path, experiments, root, opened, quiet, log)


AHEAD = ("factory.data.catalog", "factory.data.tables", "factory.post.tasks", "matplotlib.figure", "matplotlib.backends.backend_agg",
         "matplotlib.ticker")
"""What this process imports for its own later steps and not at its start (the dataset checks' and the shared benchmark
data's tables, the held-out corpus's generator, the run report's plots): about a second of imports, made while its first
stage computes instead of between the stages (`resources.launcher.import_beside_the_next_stage`)."""


def pending_bases(experiments: list[Experiment], root: Path) -> list[Base]:
    """The other experiments' models these start from that are not computed yet, one per file."""
    registry = open_registry(root / "registry")
    bases = [base for experiment in experiments if (base := resolve(experiment, registry)) is not None and base.pending]
    return list({base.file: base for base in bases}.values())


@contextlib.contextmanager
def warm_stages(experiments: list[Experiment], root: Path) -> Iterator[None]:
    """Within the block, stages fork from a warm interpreter started now, when some stage must be computed; while the
    stages compute, this process imports what its own later steps need (`AHEAD`)."""
    try:
        plans = build_plan(experiments, open_registry(root / "registry"))
    except ConfigError:  # e.g. a source directory gone: the stage that cannot be planned fails in Dagster, saying so
        plans = []
    kinds = [plan.kind for plan in plans if plan.status == "run"]
    if kinds:
        modules, first = warm_order(kinds, tracker_backend(os.environ))
        with warm_starts(modules, first=first):
            from resources.launcher import import_beside_the_next_stage  # Dagster's import, beside the warm interpreter's

            import_beside_the_next_stage(AHEAD)
            yield
    else:
        yield


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit 0 ok, 1 a stage failed, 2 bad input, 130 interrupted (Ctrl-C, SIGTERM: the run is then CANCELED and
    holds nothing). A failure is one line on stderr (each failed step's own message) naming the log file that holds the
    whole trace."""
    parser = argparse.ArgumentParser(prog="python -m assets.run")
    parser.add_argument("experiment", type=Path)
    parser.add_argument("--root", type=Path, default=Path(".factory"))
    parser.add_argument("--again", help="The command that goes on from where an interrupted run stopped, as a hint prints it.")
    args = parser.parse_args(argv)
    log = log_path(args.root, args.experiment)
    again = f"{args.again or f'`factory run {args.experiment}`'} goes on from there"

    def stopped(said: str) -> None:  # the watch stopped a run that waited for a slot
        print(f"error: {said}; {again} (full log: {log})", file=sys.stderr)

    try:
        result = run_experiment(args.experiment, args.root, log=log, on_stopped=stopped)  # its instance closed before the exit
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # between Dagster's runs, where no step was there to stop
        with log.open("a") as file:
            traceback.print_exc(file=file)
        print(f"error: interrupted; {again} (full log: {log})", file=sys.stderr)
        return Interrupted.exit_code
    if result.success:
        return 0
    from assets.execution import failure_messages, interrupted

    messages = failure_messages(result) or ["the run failed"]
    if interrupted(result):
        messages[-1] += f"; {again}"
    messages[-1] += f" (full log: {log})"
    for message in messages:
        print(f"error: {message}", file=sys.stderr)
    return Interrupted.exit_code if interrupted(result) else 1


def log_path(root: Path, experiment: Path) -> Path:
    """Where one `factory run` logs everything, stack traces included: `<root>/logs/<UTC time>-<experiment>-<pid>.log`."""
    directory = root.resolve() / "logs"
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{experiment.stem}-{os.getpid()}.log"


if __name__ == "__main__":
    exit_now(main())  # every run's events are committed; unloading Dagster module by module would take another second
