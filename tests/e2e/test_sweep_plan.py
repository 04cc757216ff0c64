"""`factory plan` on two 2x2 sweeps predicts exactly what running them computes, and a rerun computes nothing.

The first sweep is over the tokenizer and the pretraining learning rate: the data is shared by all four variants, each
tokenizer by two. The second, on the same stores, is over the SFT and RL learning rates: it computes pretraining once,
SFT twice and RL four times; every checkpoint of every stage is evaluated on code_exec. SFT saves sharded checkpoints
(directories), so they travel the same path to partitions, evaluations and RL as single files.
"""

import pytest
from dagster import DagsterInstance, materialize

from assets.execution import EVERYTHING, failure_messages, resources_at
from assets.partitions import CHECKPOINTS
from assets.run import run_experiment
from factory.cli.common import dagster_home
from factory.config import STAGES, load_file
from factory.evals.base import EVALUATIONS
from factory.ops.plan import build_plan, counts
from factory.registry import ArtifactStore

pytestmark = pytest.mark.e2e
DATA = """data:
  datasets:
    stdlib:
      source: {{include: ["json/**/*.py", "email/**/*.py"]}}
"""
"""The data both sweeps read: computed once for both."""
GRID = """---
extends: {base}
""" + DATA + """tokenizer:
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
eval: null
sweep:
  tokenizer.vocab_size: [300, 320]
  pretrain.lr: [0.001, 0.002]
---
Tokenizer x learning rate: the data is shared by all four, each tokenizer by two. Not evaluated: the plan counts stages.
"""
POST = """---
extends: {base}
""" + DATA + """tokenizer:
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
  actors: 0
eval:
  benchmarks: [code_exec]
  max_bytes: 5000
sweep:
  sft.lr: [0.001, 0.002]
  rl.lr: [0.0001, 0.0002]
---
SFT x RL learning rates: one base model, two fine-tuned ones, four RL runs.
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


# About a minute alone on 2 cores, and it must be: what it proves is the sharing across whole sweeps through Dagster (in the
# second, eleven training stages computed where four separate runs compute sixteen, and every checkpoint of every stage
# evaluated), which no smaller run shows. The two sweeps share one root so that the second one's data and tokenizer are
# the first one's (computed once for both).
def test_plan_counts_match_execution_counts_and_a_post_training_sweep_shares_its_base_models(tmp_path, tiny_path):
    root = tmp_path / "state"
    registry = ArtifactStore(root / "registry")
    instance = DagsterInstance.from_config(str(dagster_home(root)))

    grid = tmp_path / "grid.md"
    grid.write_text(GRID.format(base=tiny_path))
    variants = load_file(grid)
    predicted = counts(build_plan(variants, registry))
    assert predicted == {"raw_datasets": 1, "deduped_datasets": 1, "filtered_datasets": 1, "blend": 1, "tokenizer": 2, "pretrain": 4, "model": 4}
    assert run_all(grid, root, instance) == predicted
    assert counts(build_plan(variants, registry)) == {}
    assert {p.status for p in build_plan(variants, registry)} == {"cached"}
    assert run_all(grid, root, instance) == {}

    post = tmp_path / "post.md"
    post.write_text(POST.format(base=tiny_path))
    small = {"ops": {"code_exec_tasks": {"config": {"functions": 40, "calls_per_function": 2, "stdlib_functions": 0, "seed": 0}}}}
    assert materialize(EVERYTHING, selection=["code_exec_tasks"], instance=instance, resources=resources_at(root), run_config=small).success
    variants = load_file(post)
    predicted = counts(build_plan(variants, registry))
    assert {kind: predicted[kind] for kind in ("pretrain", "sft", "rl", "model")} == {"pretrain": 1, "sft": 2, "rl": 4, "model": 4}
    assert run_all(post, root, instance) == predicted

    sft = list(registry.manifests("sft"))
    assert all((registry.path(m.digest) / "step_000006" / ".metadata").is_file() for m in sft), "SFT published sharded checkpoints"
    rl = list(registry.manifests("rl"))
    assert len(rl) == 4 and all(m.summary["actors"] == 0 and m.summary["started_from"] == "sft" for m in rl)
    assert len({m.inputs["sft"] for m in rl}) == 2  # each SFT model is the start of two RL runs
    names = {variant.name for variant in variants}
    models = [m for m in registry.manifests("model") if m.experiment in names]
    assert {m.inputs["rl"] for m in models} == {m.digest for m in rl}  # the exported model is the RL stage's
    keys = set(instance.get_dynamic_partitions(CHECKPOINTS))
    evaluated = {m.summary["checkpoint"] for m in registry.manifests(EVALUATIONS) if m.summary["benchmark"] == "code_exec"}
    for variant in variants:
        stage_keys = {stage: {k for k in keys if k.startswith(f"{variant.name}__{stage}-")} for stage in ("pretrain", "sft", "rl")}
        assert {stage: len(found) for stage, found in stage_keys.items()} == {"pretrain": 1, "sft": 2, "rl": 2}
        assert set().union(*stage_keys.values()) <= evaluated
    assert run_all(post, root, instance) == {}  # nothing twice
