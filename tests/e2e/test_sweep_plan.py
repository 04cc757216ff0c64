"""`factory plan` on a 2x2 sweep predicts exactly what running it computes, and a rerun computes nothing."""

import pytest
from dagster import DagsterInstance

from assets.execution import failure_messages
from assets.run import run_experiment
from factory.cli.common import dagster_home
from factory.config import STAGES, load_file
from factory.registry import ArtifactStore
from factory.ops.plan import build_plan, counts

pytestmark = pytest.mark.e2e
SWEEP = """---
extends: {base}
data:
  datasets:
    stdlib:
      source: {{include: ["json/**/*.py", "email/**/*.py"]}}
tokenizer:
  sample_bytes: 200000
model:
  n_layer: 1
  n_embd: 32
  context: 32
pretrain:
  steps: 4
  batch_size: 2
  warmup_steps: 1
  checkpoint_every: 0
eval:
  max_bytes: 5000
sweep:
  tokenizer.vocab_size: [300, 320]
  pretrain.lr: [0.001, 0.002]
---
Tokenizer x learning rate: the data is shared by all four, each tokenizer by two.
"""


def run_all(path, root, instance) -> dict[str, int]:
    """How many of each experiment stage the run computed (evaluation batches, which the plan does not count, left out)."""
    totals: dict[str, int] = {}
    before = len(instance.get_runs())
    result = run_experiment(path, root, instance, quiet=True)
    assert result.success, failure_messages(result)
    for run in instance.get_runs()[: len(instance.get_runs()) - before]:
        events = instance.all_logs(run.run_id)
        for event in events:
            if event.dagster_event and event.dagster_event.is_step_materialization:
                materialization = event.dagster_event.step_materialization_data.materialization
                if materialization.metadata.get("cache") and materialization.metadata["cache"].value == "miss":
                    kind = materialization.asset_key.to_user_string()
                    if kind in STAGES:
                        totals[kind] = totals.get(kind, 0) + 1
    return totals


def test_plan_counts_match_execution_counts(tmp_path, tiny_path):
    path = tmp_path / "grid.md"
    path.write_text(SWEEP.format(base=tiny_path))
    root = tmp_path / "state"
    registry = ArtifactStore(root / "registry")
    variants = load_file(path)
    predicted = counts(build_plan(variants, registry))
    assert predicted == {"raw_datasets": 1, "deduped_datasets": 1, "filtered_datasets": 1, "blend": 1, "tokenizer": 2, "pretrain": 4, "model": 4}
    instance = DagsterInstance.from_config(str(dagster_home(root)))
    assert run_all(path, root, instance) == predicted
    assert counts(build_plan(variants, registry)) == {}
    assert {p.status for p in build_plan(variants, registry)} == {"cached"}
    assert run_all(path, root, instance) == {}
