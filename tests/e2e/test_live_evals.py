"""Evaluations while training goes on: a checkpoint saved mid-run is due at the automation sensor's next tick and is
evaluated, from the bytes its partition recorded, before the training run ends (the sensor's ticks run here, in process,
as the daemon would run them; training runs as `factory run` in its own process, on the same instance)."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, evaluate_automation_conditions, materialize

from assets.definitions import defs
from assets.execution import EVERYTHING, resources_at
from factory.cli.common import dagster_home
from factory.registry import ArtifactStore
from tests.e2e.conftest import TINY_SLICE

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
TICK_S = 2
VARIANT = """---
extends: {base}
{data}model: {{n_layer: 1, n_head: 2, n_embd: 64, context: 64}}
pretrain:
  steps: 600
  batch_size: 8
  checkpoint_every: 100
  keep_last: 8
eval:
  benchmarks: [next_line]
  max_bytes: 20000
---
A smaller model than the tiny recipe's, on a slice of its data, trained for longer, with a checkpoint every 100 steps:
evaluated as they come.
"""


# The training run has to last long enough for a mid-run checkpoint to be evaluated before it ends, whatever the
# machine's speed: 600 steps, a bound on a loaded machine. Once one checkpoint is evaluated, the run is stopped as Ctrl-C
# stops it (what it would train and evaluate after that proves nothing here).
def test_a_checkpoint_is_evaluated_while_its_training_run_goes_on(tmp_path, tiny_path):
    root = tmp_path / "state"
    home = dagster_home(root)  # the instance `factory run` writes to, and this test's ticks read
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "longer.md").write_text(VARIANT.format(base=tiny_path, data=TINY_SLICE))
    log = tmp_path / "training.log"
    with open(log, "w") as out:
        training = subprocess.Popen([sys.executable, "-m", "factory", "run", str(experiments / "longer.md"), "--root", str(root)],
                                    cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    instance = DagsterInstance.from_config(str(home))
    resources, cursor, during = resources_at(root, experiments), None, []
    deadline = time.monotonic() + 900
    try:
        while not during and training.poll() is None and time.monotonic() < deadline:
            tick = evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
            cursor = tick.cursor
            for key in sorted(k for k in tick.get_requested_partitions(AssetKey("evaluations")) if k.startswith("next_line|longer__")):
                run = materialize(EVERYTHING, selection=["evaluations"], partition_key=key, instance=instance, resources=resources,
                                  raise_on_error=False, run_config=QUIET)
                if run.success and training.poll() is None:
                    during.append(key)
            if not during:
                time.sleep(TICK_S)
        if during:
            with contextlib.suppress(ProcessLookupError):  # it may have ended since
                os.killpg(training.pid, signal.SIGINT)  # Ctrl-C at its terminal
        assert training.wait(timeout=max(60.0, deadline - time.monotonic())) in (0, 130), log.read_text()[-3000:]
    finally:
        if training.poll() is None:
            training.kill()
    assert during, "no checkpoint was evaluated while its run was still training"
    results = {m.summary["checkpoint"]: m for m in ArtifactStore(root / "registry").manifests("evaluations") if m.summary["experiment"] == "longer"}
    for key in during:
        checkpoint = key.split("|")[1]
        assert checkpoint in results
