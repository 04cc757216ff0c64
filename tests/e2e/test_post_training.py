"""Post-training through Dagster: a 2x2 sweep over the SFT and RL learning rates computes pretraining once, SFT twice
and RL four times, as `factory plan` predicts; every checkpoint of every stage is evaluated on code_exec. SFT saves
sharded checkpoints (directories), so they travel the same path to partitions, evaluations and RL as single files."""

import pytest
from dagster import DagsterInstance, materialize

from assets.execution import EVERYTHING, resources_at
from assets.partitions import CHECKPOINTS
from factory.cli.common import dagster_home
from factory.config import load_file
from factory.registry import ArtifactStore
from factory.evals.base import EVALUATIONS
from factory.ops.plan import build_plan, counts
from tests.e2e.test_sweep_plan import run_all

pytestmark = pytest.mark.e2e
SWEEP = """---
extends: {base}
data:
  datasets:
    stdlib:
      source: {{include: ["json/**/*.py", "email/**/*.py"]}}
tokenizer:
  vocab_size: 320
  sample_bytes: 200000
model:
  n_layer: 1
  n_embd: 32
  context: 64
pretrain:
  steps: 4
  batch_size: 2
  warmup_steps: 1
  checkpoint_every: 0
sft:
  steps: 6
  batch_size: 4
  checkpoint_every: 3
  checkpoint_format: sharded
rl:
  steps: 2
  prompts_per_step: 2
  group_size: 2
  max_new_tokens: 4
  checkpoint_every: 1
  log_every: 1
  actors: 1
eval:
  benchmarks: [code_exec]
  max_bytes: 5000
sweep:
  sft.lr: [0.001, 0.002]
  rl.lr: [0.0001, 0.0002]
---
SFT x RL learning rates: one base model, two fine-tuned ones, four RL runs.
"""


# Two minutes or more on 2 cores, the suite's longest test, and it must be: what it proves is the sharing across a
# whole sweep through Dagster (eleven training stages computed where four separate runs compute sixteen, and every
# checkpoint of every stage evaluated), which no smaller run shows.
def test_a_post_training_sweep_shares_its_base_models_and_evaluates_every_stage(tmp_path, tiny_path):
    path = tmp_path / "post.md"
    path.write_text(SWEEP.format(base=tiny_path))
    root = tmp_path / "state"
    instance = DagsterInstance.from_config(str(dagster_home(root)))
    small = {"ops": {"code_exec_tasks": {"config": {"functions": 80, "calls_per_function": 2, "stdlib_functions": 10, "seed": 0}}}}
    assert materialize(EVERYTHING, selection=["code_exec_tasks"], instance=instance, resources=resources_at(root), run_config=small).success
    variants = load_file(path)
    registry = ArtifactStore(root / "registry")
    predicted = counts(build_plan(variants, registry))
    assert {kind: predicted[kind] for kind in ("pretrain", "sft", "rl", "model")} == {"pretrain": 1, "sft": 2, "rl": 4, "model": 4}
    assert run_all(path, root, instance) == predicted

    sft = list(registry.manifests("sft"))
    assert all((registry.path(m.digest) / "step_000006" / ".metadata").is_file() for m in sft), "SFT published sharded checkpoints"
    rl = list(registry.manifests("rl"))
    assert len(rl) == 4 and all(m.summary["actors"] == 1 and m.summary["started_from"] == "sft" for m in rl)
    assert len({m.inputs["sft"] for m in rl}) == 2  # each SFT model is the start of two RL runs
    models = list(registry.manifests("model"))
    assert {m.inputs["rl"] for m in models} == {m.digest for m in rl}  # the exported model is the RL stage's
    keys = set(instance.get_dynamic_partitions(CHECKPOINTS))
    evaluated = {m.summary["checkpoint"] for m in registry.manifests(EVALUATIONS) if m.summary["benchmark"] == "code_exec"}
    for variant in variants:
        stage_keys = {stage: {k for k in keys if k.startswith(f"{variant.name}__{stage}-")} for stage in ("pretrain", "sft", "rl")}
        assert {stage: len(found) for stage, found in stage_keys.items()} == {"pretrain": 1, "sft": 2, "rl": 2}
        assert set().union(*stage_keys.values()) <= evaluated
    assert run_all(path, root, instance) == {}  # nothing twice
