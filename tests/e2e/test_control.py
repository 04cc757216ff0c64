"""Control rules through Dagster: a rule stops pretraining; the event log, the tracker and the manifest say so."""

import json
from pathlib import Path

import pytest
import warnings

from dagster import AssetKey, DagsterInstance, PreviewWarning

from assets.execution import failure_messages
from assets.run import run_experiment
from factory.cli.common import dagster_home
from factory.config import load
from factory.registry import ArtifactStore

pytestmark = pytest.mark.e2e
CONTROLLED = """\
---
seed: 7
data:
  datasets:
    stdlib:
      source: {kind: python-stdlib, include: ["json/**/*.py", "email/**/*.py", "logging/**/*.py", "*.py"]}
tokenizer: {vocab_size: 512, sample_bytes: 500000}
model: {n_layer: 1, n_head: 2, n_embd: 32, context: 64}
pretrain: {steps: 60, batch_size: 8, checkpoint_every: 0, log_every: 10}
control:
  eval_every: 10
  eval_batches: 2
  metrics:
    - {name: evals, kind: history, window: 5}
  rules:
    - name: enough
      on: [eval]
      when: "step >= 30"
      do: [{alert: "stopping at {step} with {evals.eval_loss}"}, stop]
---
Stops itself at step 30 of 60.
"""


@pytest.fixture(scope="module")
def controlled(tmp_path_factory):
    """Its own root and instance: the shared tiny pipeline's state stays as its tests expect."""
    warnings.filterwarnings("ignore", category=PreviewWarning)
    root = tmp_path_factory.mktemp("controlled")
    path = tmp_path_factory.mktemp("experiments") / "tiny-controlled.md"
    path.write_text(CONTROLLED)
    instance = DagsterInstance.from_config(str(dagster_home(root)))
    result = run_experiment(path, root, instance)
    assert result.success, failure_messages(result)
    return {"root": root, "instance": instance, "name": load(path).name}


def test_a_rule_stops_pretraining_and_the_manifest_says_so(controlled):
    registry = ArtifactStore(controlled["root"] / "registry")
    records = controlled["instance"].fetch_materializations(AssetKey("pretrain"), limit=20).records
    [mine] = [r.asset_materialization for r in records if r.asset_materialization.partition == controlled["name"]]
    metadata = {key: value.value for key, value in mine.metadata.items()}
    assert metadata["summary/stopped"] == "stopped at step 30 of 60 by enough"
    assert metadata["summary/steps"] == 30
    assert metadata["summary/control_actions"] == 1
    assert 0 < metadata["summary/validation_loss"] < 10  # the last in-loop evaluation, at step 30
    assert "step 30 eval: enough -> alert, stop" in metadata["summary/control_log"]
    manifest = registry.lookup(metadata["fingerprint"])
    assert manifest.summary["stopped"] == metadata["summary/stopped"]
    [record] = [json.loads(line) for line in (Path(metadata["artifact"]) / "control.jsonl").read_text().splitlines()]
    assert record["alert"].startswith("stopping at 30 with [")
    run = json.loads((Path(metadata["artifact"]) / "run.json").read_text())
    assert run["final"] == "step_000030.pt"


def test_the_alert_is_in_the_dagster_event_log_and_on_the_tracker_run(controlled):
    from mlflow.tracking import MlflowClient

    instance = controlled["instance"]
    said = [e.event_log_entry.user_message for run in instance.get_runs(limit=10) for e in instance.get_records_for_run(run.run_id).records]
    assert any("control: rule enough at step 30 (eval): alert, stop - ALERT: stopping at 30" in message for message in said), said[-20:]
    records = controlled["instance"].fetch_materializations(AssetKey("pretrain"), limit=20).records
    [mine] = [r.asset_materialization for r in records if r.asset_materialization.partition == controlled["name"]]
    client = MlflowClient(tracking_uri=f"sqlite:///{controlled['root'] / 'mlflow' / 'mlflow.db'}")
    tags = client.get_run(mine.metadata["summary/tracker_run"].value).data.tags
    assert tags["alert.enough"].startswith("step 30: stopping at 30")
    assert tags["control.last_action"].startswith("step 30 eval: enough -> alert, stop")
