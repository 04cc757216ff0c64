"""A stage process for tests/assets/test_checkpoints.py: it saves checkpoints in a directory of its own, which nothing
on the asset's side is told of, and goes on only once the asset has recorded each, so it ends with a failure when
the asset learns of its checkpoints only after it ends. It removes the directory before it exits.

Usage: checkpointing_stage.py DIRECTORY DAGSTER_HOME KEY_OF_STEP_1 KEY_OF_STEP_2
"""

import shutil
import sys
import time
from pathlib import Path

import torch
from dagster import DagsterInstance

from factory.runtime.report import open_reporter
from factory.train.checkpoint import CheckpointDir, RetentionPolicy

CHECKPOINTS = "checkpoints"
DEADLINE_S = 120.0


def wait_for(instance: DagsterInstance, present: str, absent: str | None = None) -> None:
    """Until the asset made `present` a partition (and removed `absent`); exit 1 at the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while not (instance.has_dynamic_partition(CHECKPOINTS, present) and (absent is None or not instance.has_dynamic_partition(CHECKPOINTS, absent))):
        if time.monotonic() > deadline:
            sys.exit(f"the asset did not record {present}" + (f" and forget {absent}" if absent else "") + " while this stage ran")
        time.sleep(0.2)


def main() -> None:
    directory, home, first, second = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    instance = DagsterInstance.local_temp(home)
    with open_reporter("pretrain") as reporter:
        reporter.metrics(1, {"loss": 3.0})
        store = CheckpointDir(directory, RetentionPolicy(keep_last=1, best_metric=None), reporter.log, on_event=reporter.checkpoint)
        store.save(1, {"step": 1, "w": torch.zeros(4)}, {"loss": 3.0, "lr": 0.1, "tokens_seen": 64.0})
        wait_for(instance, first)
        store.save(2, {"step": 2, "w": torch.ones(4)}, {"loss": 2.0, "lr": 0.1, "tokens_seen": 128.0})  # retention deletes step 1
        wait_for(instance, second, absent=first)
        shutil.rmtree(directory)
        reporter.materialized({"steps": 2}, "v1")


if __name__ == "__main__":
    main()
