"""A recipe with `pretrain.parallelism: fsdp` on two ranks through Dagster: trained, its sharded checkpoints evaluated."""

from pathlib import Path

import pytest
from dagster import DagsterInstance

from assets.execution import failure_messages
from assets.run import run_experiment
from factory.cli.common import dagster_home
from factory.config import load
from factory.registry import ArtifactStore

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
RECIPE = """---
extends: {base}
pretrain:
  steps: 40
  warmup_steps: 5
  checkpoint_every: 20
  checkpoint_format: sharded
  parallelism: fsdp
  activation_checkpointing: selective
resources:
  processes_per_node: 2
---
# tiny-code-lm on two ranks of FSDP
"""


def test_a_fsdp_recipe_trains_on_two_ranks_and_its_sharded_checkpoints_are_evaluated(tmp_path):
    path = tmp_path / "tiny-fsdp.md"
    path.write_text(RECIPE.format(base=REPO / "experiments" / "tiny-code-lm.md"))
    experiment = load(path)
    assert experiment.pretrain.parallelism == "fsdp" and experiment.resources.processes_per_node == 2
    root = tmp_path / "root"
    result = run_experiment(path, root, DagsterInstance.from_config(str(dagster_home(root))), quiet=True)
    assert result.success, failure_messages(result)
    manifests = list(ArtifactStore(root / "registry").manifests())
    [pretrain] = [m for m in manifests if m.kind == "pretrain"]
    assert pretrain.summary["ranks"] == 2 and pretrain.summary["steps"] == 40
    assert pretrain.config["pretrain"]["parallelism"] == "fsdp", "in the resolved config and the fingerprint"
    # selective: one of the two blocks recomputes, so some activations are kept and some saved
    assert pretrain.summary["activations_mb"] > 0 and pretrain.summary["activations_saved_mb"] > 0
    assert {"step_000040/__0_0.distcp", "step_000040/__1_0.distcp", "step_000040/.metadata"} <= set(pretrain.files), "each rank wrote its shard"
    evaluated = {(m.summary["step"], m.summary["benchmark"]) for m in manifests if m.kind == "evaluations"}
    assert {(20, "val_bpb"), (40, "val_bpb"), (40, "heldout_bpb")} <= evaluated, evaluated
    assert any(m.kind == "model" for m in manifests), "the final sharded checkpoint was exported as a model"
