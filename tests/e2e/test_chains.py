"""Experiments that build on each other, through Dagster: a base model is made and promoted; an SFT sweep starts from the
alias without recomputing any base stage; RL starts from the better SFT model by digest; a second SFT round starts from
the RL file's model. Moving the alias plans the SFT sweep again and says why, while the earlier manifests keep naming
the model they used; lineage follows the chain across the four files, and the leaderboard shows each model's base."""

import html
import json
import logging
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, SensorResult, build_sensor_context, materialize
from starlette.testclient import TestClient

from assets.execution import EVERYTHING, resources_at
from assets.partitions import FROM_DIGEST_TAG
from assets.sensors import experiments_at_head, read_cursor
from factory.cli.common import dagster_home
from factory.config import load_file
from factory.config.stages import BASE
from factory.data.catalog import CatalogConfig
from factory.evals.publish import current_board
from factory.ops.diff import diff_artifacts
from factory.ops.lineage import Lineage
from factory.ops.plan import build_plan, counts
from factory.ops.promote import promote
from factory.ops.reproduce import reproduce
from factory.podium.app import create_app
from factory.podium.generate import Generator, candidates
from factory.registry import ArtifactStore
from factory.registry.layout import DATASETS_FILE
from resources import ExperimentFiles, FactoryStores
from tests.assets.test_sensors import git
from tests.e2e.test_sweep_plan import run_all
from tests.stages.test_sft_data import CHATS

pytestmark = pytest.mark.e2e
BASE_FILE = """---
extends: {tiny}
data:
  datasets:
    stdlib:
      source: {{include: ["json/**/*.py", "email/**/*.py", "http/**/*.py"]}}
    site_packages:
      source: {{include: ["click/**/*.py"]}}
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
data:
  datasets:
    chat:
      source: {{kind: directory, path: {chats}, include: ["*.jsonl"], format: jsonl, columns: [messages]}}
sft:
  from: "rl.md#model"
  data: {{dataset: chat, format: messages}}
  steps: 2
  batch_size: 4
  lr: 0.0005
  log_every: 1
---
The second SFT round, on the RL model, on chats the team wrote: ingested, deduplicated and filtered by the data stages.
"""
CHAT_ROUND = {"raw_datasets": 1, "deduped_datasets": 1, "filtered_datasets": 1, "sft": 1, "model": 1}
LOCAL = "http://127.0.0.1:8765"
NEXT_FILE = """---
sft: {from: "base.md#model", steps: 1, batch_size: 2}
---
Merged with the base, so it waits for the base's model.
"""
SMALL_TASKS = {"ops": {"code_exec_tasks": {"config": {"functions": 40, "calls_per_function": 2, "stdlib_functions": 0, "seed": 0}}}}


def tick(instance: DagsterInstance, directory: Path, root: Path, cursor: str | None = None) -> SensorResult:
    """One tick of the git sensor over the experiment files committed in `directory`."""
    resources = {"experiments": ExperimentFiles(directory=str(directory), run_existing=True), "stores": FactoryStores(root=str(root))}
    result = experiments_at_head(build_sensor_context(instance=instance, cursor=cursor, resources=resources))
    assert isinstance(result, SensorResult), result
    return result


def model_of(registry: ArtifactStore, training: str) -> str:
    """The digest of the model exported from a training artifact."""
    return next(m.digest for m in registry.manifests("model") if training in m.inputs.values())


def test_a_base_an_sft_sweep_rl_and_a_second_round_build_on_each_other(tmp_path, tiny_path):
    root = tmp_path / "state"
    instance = DagsterInstance.from_config(str(dagster_home(root)))
    registry = ArtifactStore(root / "registry")
    assert materialize(EVERYTHING, selection=["code_exec_tasks"], instance=instance, resources=resources_at(root),
                       run_config=SMALL_TASKS).success
    files = {"tiny.md": tiny_path.read_text(), "base.md": BASE_FILE.format(tiny="tiny.md"), "sft.md": SFT_FILE.format(), "next.md": NEXT_FILE}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    # Merged together, a base and a file that starts from it: the sensor runs the base, and the other file once its model is made.
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", *files)
    git(tmp_path, "commit", "-qm", "a base and a fine-tune of it")
    first = tick(instance, tmp_path, root)
    assert "base" in {r.partition_key for r in first.run_requests} and "next" not in {r.partition_key for r in first.run_requests}
    assert "next.md" in first.cursor

    assert run_all(tmp_path / "base.md", root, instance)["pretrain"] == 1
    [base_model] = registry.manifests("model")
    second = tick(instance, tmp_path, root, first.cursor)
    [waited] = second.run_requests
    assert waited.partition_key == "next" and waited.tags[FROM_DIGEST_TAG] == base_model.digest
    assert read_cursor(second.cursor)[1] == ("sft.md",)  # still waits: production names no model yet
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

    (tmp_path / "chats").mkdir()
    (tmp_path / "chats" / "chats.jsonl").write_text("".join(json.dumps({"messages": chat}) + "\n" for chat in [*CHATS, CHATS[0]]))
    (tmp_path / "sft2.md").write_text(ROUND_TWO.format(chats=tmp_path / "chats"))
    round_two = load_file(tmp_path / "sft2.md")
    assert counts(build_plan(round_two, registry)) == CHAT_ROUND  # the chats are ingested; nothing of the chain is made again
    assert run_all(tmp_path / "sft2.md", root, instance) == CHAT_ROUND
    last = next(m for m in registry.manifests("sft") if m.experiment == "sft2")
    assert last.inputs[BASE] == model_of(registry, rl.digest) and last.base["from"] == "rl.md#model"
    shown = next(r.asset_materialization for r in instance.fetch_materializations(AssetKey("sft"), limit=20).records
                 if r.asset_materialization.partition == "sft2")
    assert shown.metadata["base_experiment"].value == "/assets/model?partition=rl"  # a link to the base's partition in the UI
    assert shown.metadata["base_model"].value == str(registry.path(last.inputs[BASE]))
    [filtered] = [m for m in registry.manifests("filtered_datasets") if m.experiment == "sft2"]
    chats = json.loads((registry.path(filtered.digest) / DATASETS_FILE).read_text())["chat"]
    assert chats["rows"] == len(CHATS)  # the duplicate chat is gone

    # Lineage crosses the four files: from the last model back to the base, and from the base to every model made on it.
    graph = Lineage(registry)
    final = model_of(registry, last.digest)
    final_manifest = next(m for m in registry.manifests("model") if m.digest == final)
    chain = graph.bases(final)
    assert [(step["digest"], step["named"]) for step in chain] == [
        (model_of(registry, rl.digest), "rl.md#model"),
        (model_of(registry, better.digest), f"model@{model_of(registry, better.digest)}"),
        (base_model.digest, "alias:production"),
    ]
    made_from_base = {m["digest"]: m for m in graph.fine_tuned(base_model.digest)}
    assert set(made_from_base) == {model_of(registry, m.digest) for m in [*fine_tuned, rl, last]}
    # Its three stages read the task table (sft, rl) and the chats' filtered version (sft2).
    assert made_from_base[final]["data"] == ["post.code_exec_tasks@v1", f"{chats['table']}@{chats['content_tag']}"]
    assert len(made_from_base[final]["stages"]) == 3
    board = {row.experiment: row for row in current_board(registry).rows}
    assert all(board[e.name].base == f"alias:production ({base_model.digest[:12]})" for e in sft)
    separated = diff_artifacts(registry.lookup(fine_tuned[0].fingerprint), registry.lookup(fine_tuned[1].fingerprint), registry)
    assert any(line.startswith("config: sft.lr:") for line in separated)
    rounds = diff_artifacts(registry.lookup(fine_tuned[0].fingerprint), registry.lookup(last.fingerprint), registry)
    assert "from: alias:production -> rl.md#model" in rounds and any(line.startswith("input base:") for line in rounds), rounds
    assert any(line.startswith("config: sft.data") for line in rounds), rounds  # the chats instead of the task table

    # Podium prompts the chat model with a row's conversation through the template it was fine-tuned with.
    podium = TestClient(create_app(root), base_url=LOCAL, headers={"origin": LOCAL})
    form = podium.get("/generate", params={"table": chats["table"], "snapshot": chats["content_tag"], "row": "0", "column": "messages"})
    assert form.status_code == 200 and 'id="chat" checked' in form.text and 'id="reply"' in form.text
    [chat_model] = [c for c in candidates(registry) if c.exported and c.experiment == "sft2"]
    assert chat_model.chat_template is not None
    prompt = json.dumps(CHATS[3][:2])
    shown = podium.post("/generate", data={"ckpt": chat_model.sha256, "prompt": prompt, "chat": "on", "new_tokens": "6"})
    assert shown.status_code == 200 and 'id="completions"' in shown.text
    completion = Generator(registry).complete(chat_model, prompt, new_tokens=6, chat=True)
    assert completion.prompt == "<|system|>\nAnswer with a number.\n<|user|>\nWhat is 3 + 3?\n<|assistant|>\n"
    assert html.escape(completion.text) in shown.text

    # Reproducing the last model runs the whole chain again, through every file and alias, and gets the same bytes.
    again = reproduce(registry, CatalogConfig.at(root), registry.lookup(final_manifest.fingerprint), logging.getLogger("test"))
    ran = [stage.kind for stage in again.stages]
    assert again.matched, again.first_difference
    assert ran.count("model") == 4 and {"pretrain", "sft", "rl", "tokenizer", "filtered_datasets"} <= set(ran), ran

    # The alias moves: the sweep is planned again from the new model, saying why; the finished runs keep what they used.
    promote(registry, registry.lookup(final_manifest.fingerprint), "production",
            "the second round", "test", "none")
    again = [plan for plan in build_plan(sft, registry) if plan.kind == "sft"]
    assert all(plan.status == "run" and f"alias production moved from {base_model.digest[:12]} to {final[:12]}" in plan.detail
               for plan in again), [plan.detail for plan in again]
    assert {registry.lookup(m.fingerprint).inputs[BASE] for m in fine_tuned} == {base_model.digest}
