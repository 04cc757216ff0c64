"""Registry hit vs. compute: materialize tiny-code-lm on a fresh root, then again; print the ratio.

Both runs go through Dagster in one process, on the same machine, one after the other, so the
ratio is what a user saves by not recomputing identical stages. `--smoke`: a much smaller experiment (bench/smoke.py).
"""

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

from dagster import DagsterInstance, PreviewWarning

from assets.execution import failure_messages
from assets.run import run_experiment
from factory.cli.common import dagster_home
from smoke import write_smoke_experiment  # bench/smoke.py (the script's directory is on sys.path)

EXPERIMENT = Path(__file__).resolve().parents[1] / "experiments" / "tiny-code-lm.md"


def timed_run(experiment: Path, root: Path, instance: DagsterInstance) -> float:
    started = time.perf_counter()
    result = run_experiment(experiment, root, instance, quiet=True)
    if not result.success:
        sys.exit("\n".join(failure_messages(result)))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a much smaller experiment: checks the bench runs")
    smoke = parser.parse_args().smoke
    warnings.filterwarnings("ignore", category=PreviewWarning)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        experiment = write_smoke_experiment(root) if smoke else EXPERIMENT
        instance = DagsterInstance.from_config(str(dagster_home(root)))
        computed = timed_run(experiment, root, instance)
        reused = timed_run(experiment, root, instance)
    print(f"compute every stage: {computed:.1f} s; every stage from the registry: {reused:.1f} s")
    print(f"ratio compute / reuse: {computed / reused:.1f}x")


if __name__ == "__main__":
    main()
