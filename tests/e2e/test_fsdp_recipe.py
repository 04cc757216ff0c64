"""A recipe with `pretrain.parallelism: fsdp` on two ranks through Dagster: trained, its sharded checkpoints evaluated."""

from pathlib import Path

import pytest
from dagster import DagsterInstance

from assets.execution import failure_messages
from assets.run import run_experiment
from factory.cli.common import dagster_home
from factory.config import load
from factory.registry import ArtifactStore
from tests.e2e.conftest import TINY_SLICE

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
RECIPE = """---
extends: {base}
{data}pretrain:
  steps: 10
  warmup_steps: 2
  checkpoint_every: 5
  checkpoint_format: sharded
  parallelism: fsdp
  activation_checkpointing: selective
eval: {{benchmarks: [heldout_bpb, val_bpb], max_bytes: 20000}}
resources:
  processes_per_node: 2
---
# tiny-code-lm's model on two ranks of FSDP, on a slice of its data
"""


def test_a_fsdp_recipe_trains_on_two_ranks_and_its_sharded_checkpoints_are_evaluated(tmp_path):
    path = tmp_path / "tiny-fsdp.md"
    path.write_text(RECIPE.format(base=REPO / "experiments" / "tiny-code-lm.md", data=TINY_SLICE))
    experiment = load(path)
    assert experiment.pretrain.parallelism == "fsdp" and experiment.resources.processes_per_node == 2
    root = tmp_path / "root"
    result = run_experiment(path, root, DagsterInstance.from_config(str(dagster_home(root))), quiet=True)
    assert result.success, failure_messages(result)
    manifests = list(ArtifactStore(root / "registry").manifests())
    [pretrain] = [m for m in manifests if m.kind == "pretrain"]
    assert pretrain.summary["ranks"] == 2 and pretrain.summary["steps"] == 10
    assert pretrain.config["pretrain"]["parallelism"] == "fsdp", "in the resolved config and the fingerprint"
    # selective: one of the two blocks recomputes, so some activations are kept and some saved
    assert pretrain.summary["activations_mb"] > 0 and pretrain.summary["activations_saved_mb"] > 0
    assert {"step_000010/__0_0.distcp", "step_000010/__1_0.distcp", "step_000010/.metadata"} <= set(pretrain.files), "each rank wrote its shard"
    evaluated = {(m.summary["step"], m.summary["benchmark"]) for m in manifests if m.kind == "evaluations"}
    assert {(5, "val_bpb"), (10, "val_bpb"), (10, "heldout_bpb")} <= evaluated, evaluated
    assert any(m.kind == "model" for m in manifests), "the final sharded checkpoint was exported as a model"
