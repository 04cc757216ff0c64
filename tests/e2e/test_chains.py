"""Experiments that build on each other, through Dagster: a base model is made and promoted; an SFT sweep starts from the
alias without recomputing any base stage; RL starts from the better SFT model by digest; a second SFT round starts from
the RL file's model. Moving the alias plans the SFT sweep again and says why, while the earlier manifests keep naming
the model they used; lineage follows the chain across the four files, and the leaderboard shows each model's base."""

import pytest
from dagster import DagsterInstance, materialize

from assets.execution import EVERYTHING, resources_at
from factory.cli.common import dagster_home
from factory.config import load_file
from factory.config.stages import BASE
from factory.evals.publish import current_board
from factory.ops.diff import diff_artifacts
from factory.ops.lineage import Lineage
from factory.ops.plan import build_plan, counts
from factory.ops.promote import promote
from factory.registry import ArtifactStore
from tests.e2e.test_sweep_plan import run_all

pytestmark = pytest.mark.e2e
BASE_FILE = """---
extends: {tiny}
data:
  datasets:
    stdlib:
      source: {{include: ["json/**/*.py", "email/**/*.py", "http/**/*.py"]}}
  validation_percent: 20
tokenizer: {{vocab_size: 320, sample_bytes: 200000}}
model: {{n_layer: 1, n_embd: 32, context: 64}}
pretrain: {{steps: 4, batch_size: 2, warmup_steps: 1, checkpoint_every: 0}}
eval: null
---
The base model the others start from.
"""
SFT_FILE = """---
sft: {{from: "alias:production", steps: 3, batch_size: 4, log_every: 1}}
eval: {{benchmarks: [val_bpb], max_bytes: 3000}}
sweep:
  sft.lr: [0.001, 0.003]
---
Two learning rates on top of whatever production names.
"""
RL_FILE = """---
rl: {{from: "model@{digest}", steps: 2, prompts_per_step: 2, group_size: 2, max_new_tokens: 4, log_every: 1}}
---
GRPO from the better SFT model.
"""
ROUND_TWO = """---
sft: {from: "rl.md#model", steps: 2, batch_size: 4, lr: 0.0005, log_every: 1}
---
The second SFT round, on the RL model.
"""
SMALL_TASKS = {"ops": {"code_exec_tasks": {"config": {"functions": 60, "calls_per_function": 2, "stdlib_functions": 8, "seed": 0}}}}


def model_of(registry: ArtifactStore, training: str) -> str:
    """The digest of the model exported from a training artifact."""
    return next(m.digest for m in registry.manifests("model") if training in m.inputs.values())


def test_a_base_an_sft_sweep_rl_and_a_second_round_build_on_each_other(tmp_path, tiny_path):
    root = tmp_path / "state"
    instance = DagsterInstance.from_config(str(dagster_home(root)))
    registry = ArtifactStore(root / "registry")
    assert materialize(EVERYTHING, selection=["code_exec_tasks"], instance=instance, resources=resources_at(root),
                       run_config=SMALL_TASKS).success
    files = {"base.md": BASE_FILE.format(tiny=tiny_path), "sft.md": SFT_FILE.format()}
    for name, text in files.items():
        (tmp_path / name).write_text(text)

    assert run_all(tmp_path / "base.md", root, instance)["pretrain"] == 1
    [base_model] = registry.manifests("model")
    promote(registry, base_model, "production", "the first base", "test", "none")

    sft = load_file(tmp_path / "sft.md")
    predicted = counts(build_plan(sft, registry))
    assert predicted == {"sft": 2, "model": 2}  # nothing of the base again: data, tokenizer and pretraining are the base's
    assert run_all(tmp_path / "sft.md", root, instance) == predicted
    fine_tuned = list(registry.manifests("sft"))
    assert {m.inputs[BASE] for m in fine_tuned} == {base_model.digest}
    assert all(m.base["from"] == "alias:production" and m.base["model"] == base_model.digest for m in fine_tuned)

    better = min(fine_tuned, key=lambda m: m.summary["final_loss"])
    (tmp_path / "rl.md").write_text(RL_FILE.format(digest=model_of(registry, better.digest)))
    assert run_all(tmp_path / "rl.md", root, instance) == {"rl": 1, "model": 1}
    [rl] = registry.manifests("rl")
    assert rl.inputs[BASE] == model_of(registry, better.digest) and rl.summary["started_from"] == BASE

    (tmp_path / "sft2.md").write_text(ROUND_TWO)
    round_two = load_file(tmp_path / "sft2.md")
    assert counts(build_plan(round_two, registry)) == {"sft": 1, "model": 1}
    assert run_all(tmp_path / "sft2.md", root, instance) == {"sft": 1, "model": 1}
    last = next(m for m in registry.manifests("sft") if m.experiment == "sft2")
    assert last.inputs[BASE] == model_of(registry, rl.digest) and last.base["from"] == "rl.md#model"

    # Lineage crosses the four files: from the last model back to the base, and from the base to every model made on it.
    graph = Lineage(registry)
    final = model_of(registry, last.digest)
    chain = graph.bases(final)
    assert [(step["digest"], step["named"]) for step in chain] == [
        (model_of(registry, rl.digest), "rl.md#model"),
        (model_of(registry, better.digest), f"model@{model_of(registry, better.digest)}"),
        (base_model.digest, "alias:production"),
    ]
    made_from_base = {m["digest"]: m for m in graph.fine_tuned(base_model.digest)}
    assert set(made_from_base) == {model_of(registry, m.digest) for m in [*fine_tuned, rl, last]}
    assert made_from_base[final]["data"] == ["post.code_exec_tasks@v1"] and len(made_from_base[final]["stages"]) == 3
    board = {row.experiment: row for row in current_board(registry).rows}
    assert all(board[e.name].base == f"alias:production ({base_model.digest[:12]})" for e in sft)
    separated = diff_artifacts(registry.lookup(fine_tuned[0].fingerprint), registry.lookup(fine_tuned[1].fingerprint), registry)
    assert any(line.startswith("config: sft.lr:") for line in separated)

    # The alias moves: the sweep is planned again from the new model, saying why; the finished runs keep what they used.
    promote(registry, registry.lookup(next(m for m in registry.manifests("model") if m.digest == final).fingerprint), "production",
            "the second round", "test", "none")
    again = [plan for plan in build_plan(sft, registry) if plan.kind == "sft"]
    assert all(plan.status == "run" and f"alias production moved from {base_model.digest[:12]} to {final[:12]}" in plan.detail
               for plan in again), [plan.detail for plan in again]
    assert {registry.lookup(m.fingerprint).inputs[BASE] for m in fine_tuned} == {base_model.digest}
