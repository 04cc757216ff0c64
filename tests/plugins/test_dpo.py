"""The DPO example plugin (examples/dpo), written on `factory.plugin` only: its loss is the formula, and it runs through
Dagster on the platform's loop from a pretraining or from another experiment's model, evaluated, exported and loadable by
transformers, raising the chosen-over-rejected margin on held-out pairs; an edit of its code reruns exactly what it
computes. The average example plugin (examples/checkpoint-average) runs beside it in the same file: two kinds that end
the training chain, the file choosing which one the model stage exports."""

import importlib.util
import json
import math
import random
import shutil
import sys
import sysconfig

import pytest
import torch
from torch import nn

from factory.config.schema import ModelConfig
from factory.models.build import build_model
from factory.models.tokenizer import end_of_text, load_tokenizer
from factory.registry import ArtifactStore
from factory.registry.layout import RUN_FILE, TOKENIZER_FILE
from factory.train.objective import sequence_log_probs
from factory.train.pretrain import load_weights
from tests.plugins.conftest import REPO, factory_with

# The example package's module, as its users import it; loaded from its file, not by putting its directory on sys.path
# (where a build's egg-info would register its entry points in every later test of this process).
_spec = importlib.util.spec_from_file_location("factory_dpo", REPO / "examples" / "dpo" / "factory_dpo.py")
factory_dpo = importlib.util.module_from_spec(_spec)
sys.modules["factory_dpo"] = factory_dpo
_spec.loader.exec_module(factory_dpo)

WORDS = "apple pear plum fig kiwi lime mango peach grape melon cherry lemon olive onion carrot pepper bean pea corn rice".split()
EXPERIMENT = """\
---
image: local
seed: 3
data:
  datasets:
    src:
      source: {{kind: directory, path: "{root}/src"}}
    prefs:
      source: {{kind: directory, path: "{root}/prefs", include: ["*.jsonl"], format: jsonl, columns: [prompt, chosen, rejected]}}
      dedup: {{near_threshold: null}}
  blend:
    - {{dataset: src, weight: 1, mode: oversample}}
  validation_percent: 10
tokenizer: {{vocab_size: 300, min_frequency: 2, sample_bytes: 200000}}
model: {{n_layer: 1, n_head: 2, n_embd: 32, context: 48}}
pretrain: {{steps: 30, batch_size: 4, lr: 0.003, warmup_steps: 2, checkpoint_every: 10, keep_last: 3, log_every: 10}}
average: {{last: 3}}
dpo:
  data: {{dataset: prefs}}
  steps: 20
  batch_size: 8
  lr: 0.003
  beta: 0.5
  warmup_steps: 1
  checkpoint_every: 10
  log_every: 5
export: dpo
eval: {{benchmarks: [val_bpb], max_bytes: 20000}}
---
DPO (lower case preferred to upper case) and the average of the last checkpoints, both from one short pretraining.
"""
FROM_BASE = """\
---
image: local
seed: 3
data:
  datasets:
    prefs:
      source: {{kind: directory, path: "{root}/prefs", include: ["*.jsonl"], format: jsonl, columns: [prompt, chosen, rejected]}}
      dedup: {{near_threshold: null}}
dpo:
  from: dpo.md#model
  data: {{dataset: prefs}}
  steps: 10
  batch_size: 8
  lr: 0.001
  beta: 0.5
  warmup_steps: 1
  log_every: 5
---
A second round of DPO on the first file's exported model.
"""


def pairs(seed: int, count: int) -> list[dict[str, str]]:
    """Preference pairs: the prompt's words, chosen in lower case, rejected in upper case."""
    rng = random.Random(seed)
    picked = [" ".join(rng.sample(WORDS, 3)) for _ in range(count)]
    return [{"prompt": f"say {words}:", "chosen": f" {words}", "rejected": f" {words.upper()}"} for words in picked]


class FixedLogits(nn.Module):
    """Logits that do not depend on the input: the same distribution over a vocabulary at every position."""

    def __init__(self, logits: list[float]) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.tensor(logits))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(*x.shape, -1)


def test_the_dpo_loss_of_a_hand_computed_batch_is_the_formula():
    # The policy gives tokens 0, 1, 2 probabilities 1/6, 2/6, 3/6; the reference gives each 1/3.
    policy, reference = FixedLogits([0.0, math.log(2), math.log(3)]), FixedLogits([0.0, 0.0, 0.0])
    x = torch.zeros(1, 2, 2, dtype=torch.int64)
    y = torch.tensor([[[2, 2], [0, -1]]])  # chosen: two tokens 2; rejected: one token 0 (then PAD, not counted)
    config = factory_dpo.DPOConfig(data={"dataset": "prefs"}, steps=1, beta=0.5)
    loss = factory_dpo.loss(policy, x, y, {"reference": reference}, config)
    # (log 1/4 - log 1/6) - (log 1/9 - log 1/3) = log 4.5; -log sigmoid(0.5 log 4.5) = log(1 + 4.5 ** -0.5)
    assert loss.item() == pytest.approx(math.log(1 + 4.5 ** -0.5), rel=1e-6)
    two = factory_dpo.loss(policy, x.repeat(2, 1, 1), y.repeat(2, 1, 1), {"reference": reference}, config)
    assert two.item() == pytest.approx(2 * loss.item(), rel=1e-6)  # a sum over pairs: the loop averages over Batch.units
    loss.backward()
    assert reference.logits.grad is None and policy.logits.grad is not None  # the reference stays frozen


def margin(registry: ArtifactStore, training, tokenizer_dir, held_out) -> float:
    """The mean (chosen - rejected) summed log-probability of the completions of `held_out`, under a training stage's final weights."""
    directory = registry.path(training.digest)
    run = json.loads((directory / RUN_FILE).read_text())
    model = build_model(ModelConfig.model_validate(run["model"]), run["vocab_size"], 0)
    model.load_state_dict(load_weights(directory / run["final"]))
    model.eval()
    tokenizer = load_tokenizer(tokenizer_dir / TOKENIZER_FILE)
    eos = end_of_text(tokenizer, tokenizer_dir / TOKENIZER_FILE)
    total = 0.0
    for pair in held_out:
        scores = []
        for completion in (pair["chosen"], pair["rejected"]):
            head, tail = tokenizer.encode(pair["prompt"]).ids, tokenizer.encode(completion).ids + [eos]
            ids = torch.tensor([head + tail])
            y = torch.cat([torch.full((len(head) - 1,), -1), ids[0, len(head):]]).unsqueeze(0)
            with torch.no_grad():
                scores.append(sequence_log_probs(model, ids[:, :-1], y).item())
        total += scores[0] - scores[1]
    return total / len(held_out)


@pytest.mark.e2e
def test_dpo_runs_through_dagster_on_the_platforms_loop_and_raises_the_held_out_margin(plugins_site, tmp_path):
    site = shutil.copytree(plugins_site, tmp_path / "site")  # this test edits the plugin's code
    shutil.copytree(f"{sysconfig.get_paths()['stdlib']}/json", tmp_path / "src" / "json", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "prefs").mkdir()
    (tmp_path / "prefs" / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs(0, 64)))
    path = tmp_path / "dpo.md"
    path.write_text(EXPERIMENT.format(root=tmp_path))
    root = ["--root", str(tmp_path / "state")]
    env = {"FACTORY_DATA_ROOTS": str(tmp_path)}

    checked = factory_with(site, "check", str(path), env=env)
    assert checked.returncode == 0, checked.stderr
    run = factory_with(site, "run", str(path), *root, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    registry = ArtifactStore(tmp_path / "state" / "registry")
    [pretrain], [dpo], [average], [model] = (list(registry.manifests(kind)) for kind in ("pretrain", "dpo", "average", "model"))
    assert dpo.summary["pairs"] == 64 and dpo.summary["started_from"] == "pretrain" and dpo.inputs["pretrain"] == pretrain.digest
    assert dpo.inputs.keys() >= {"blend", "tokenizer", "filtered_datasets"}  # its own dataset, through the data stages
    assert average.summary["steps"] == [10, 20, 30]
    assert model.inputs["dpo"] == dpo.digest and model.inputs["average"] == average.digest  # the file chose dpo to export
    assert model.config == {"export": "dpo"}

    scored = {m.summary["checkpoint"] for m in registry.manifests("evaluations")}
    assert {"dpo__dpo-000010", "dpo__dpo-000020", "dpo__average-000030", "dpo__pretrain-000030"} <= scored
    board = json.loads(factory_with(site, "leaderboard", "--json", *root).stdout)
    [row] = board["rows"]
    assert row["experiment"] == "dpo" and row["checkpoints_evaluated"] == 6  # 3 of pretrain, 2 of dpo, 1 average
    stages = factory_with(site, "evals", "stages", "dpo", "--benchmark", "val_bpb", *root)
    assert "dpo__average-000030" in stages.stdout and "dpo__dpo-000020" in stages.stdout, stages.stdout
    lineage = factory_with(site, "lineage", average.digest[:12], *root)
    assert lineage.returncode == 0 and f"pretrain {pretrain.digest[:12]}" in lineage.stdout, lineage.stdout

    import transformers

    exported = transformers.AutoModelForCausalLM.from_pretrained(registry.path(model.digest), local_files_only=True, dtype=torch.float32)
    tokenizer_dir = registry.path(next(registry.manifests("tokenizer")).digest)
    ids = torch.tensor([load_tokenizer(tokenizer_dir / TOKENIZER_FILE).encode("say fig pear lime:").ids])
    dpo_dir = registry.path(dpo.digest)
    ours = build_model(ModelConfig.model_validate(json.loads((dpo_dir / RUN_FILE).read_text())["model"]), exported.config.vocab_size, 0)
    ours.load_state_dict(load_weights(dpo_dir / json.loads((dpo_dir / RUN_FILE).read_text())["final"]))
    with torch.no_grad():  # the export is DPO's final weights, as transformers computes them
        assert torch.allclose(exported(ids).logits, ours.eval()(ids), atol=1e-4)

    held_out = [p for p in pairs(1, 16) if p["prompt"] not in {q["prompt"] for q in pairs(0, 64)}]
    before, after = margin(registry, pretrain, tokenizer_dir, held_out), margin(registry, dpo, tokenizer_dir, held_out)
    assert after > before + 1.0, (before, after)

    # An edit of the plugin's code reruns DPO and the export, nothing else, and the plan says which package changed.
    module = site / "factory_dpo.py"
    module.write_text(module.read_text().replace("return pair_loss(policy, reference, config.beta).sum()",
                                                 "return pair_loss(policy, reference, config.beta).sum() * 1.0"))
    plan = factory_with(site, "plan", str(path), *root, "--json", env=env)
    assert plan.returncode == 0, plan.stderr
    decisions = {row["kind"]: row for row in json.loads(plan.stdout)["stages"]}
    assert {name for name, row in decisions.items() if row["status"] == "run"} == {"dpo", "model"}, decisions
    assert decisions["dpo"]["detail"].startswith("code: model-factory-dpo changed"), decisions["dpo"]

    # `from:` another experiment's model: the second file has no pretraining; its DPO starts from the first file's export.
    second = tmp_path / "again.md"
    second.write_text(FROM_BASE.format(root=tmp_path))
    again = factory_with(site, "run", str(second), *root, env=env)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    [round_two] = [m for m in registry.manifests("dpo") if m.experiment == "again"]
    assert round_two.summary["started_from"] == "base" and round_two.inputs["base"] in {m.digest for m in registry.manifests("model")}
    assert not [m for m in registry.manifests("pretrain") if m.experiment == "again"]


BAD = [  # (replaced line of the DPO experiment, its replacement, the line refused, the refusal)
    ("  data: {dataset: prefs}", "  data: {dataset: nosuch}", "  data:",
     "dpo.data.dataset: names no dataset of this file ('nosuch'; its datasets: src, prefs); define it under data.datasets"),
    ("  data: {dataset: prefs}", "  data: {dataset: prefs, rejected: worse}", "  data:",
     "dpo.data.dataset: dataset 'prefs' keeps no column 'worse' (its source.columns: prompt, chosen, rejected); add them to "
     "data.datasets.prefs.source.columns"),
    ("export: dpo", "export: sft", "export:",
     "export: 'sft' is no training stage of this file (they are: pretrain, dpo, average); name one of them"),
    ("export: dpo", "", "average:",
     "average: dpo and average both end the training chain (neither reads the other): add `export: <one of them>` to say whose "
     "final weights the model stage exports"),
    ("pretrain: {steps: 30", "# pretrain: {steps: 30", "dpo:",
     "dpo: dpo trains a model made before it: add a section it starts from (pretrain, sft, rl), start from a checkpoint with "
     "'model.from_hf', or from a model made elsewhere with 'dpo.from'"),
    ("  steps: 20", "  steps: 20\n  from: alias:production", "  from:",
     "dpo.from: the file trains pretrain before dpo, which starts from there; remove 'dpo.from' (or those sections)"),
]


def test_check_refuses_what_the_training_kinds_cannot_run_at_its_line(plugins_site, tmp_path):
    for name in ("src", "prefs", "files"):
        (tmp_path / name).mkdir()
    paths = [tmp_path / "files" / f"bad{index}.md" for index in range(len(BAD))]
    for path, (old, new, _, _) in zip(paths, BAD, strict=True):
        path.write_text(EXPERIMENT.format(root=tmp_path).replace(old, new, 1))
    result = factory_with(plugins_site, "check", str(tmp_path / "files"), env={"FACTORY_DATA_ROOTS": str(tmp_path)})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    for path, (_, _, refused, said) in zip(paths, BAD, strict=True):
        line = next(number for number, text in enumerate(path.read_text().splitlines(), 1) if text.startswith(refused))
        assert f"{path}:{line}: {said}" in result.stderr, result.stderr


def test_a_training_kind_without_a_batch_source_is_refused_naming_its_package(tmp_path):
    from tests.plugins.conftest import fake_package

    module = ("from factory.plugin import TrainingSection, training_kind\n"
              "class C(TrainingSection):\n    pass\n"
              "BROKEN = training_kind(name='broken', description='a loss, no batches', config=C, loss=lambda *a: 0)\n")
    site = fake_package(tmp_path / "site", "factory_broken", module, {"broken": "factory_broken:BROKEN"})
    result = factory_with(site, "check", str(REPO / "experiments" / "tiny-code-lm.md"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert ("plugin 'broken' (factory_broken:BROKEN of package factory-broken) failed to import (TypeError: training_kind() missing 1 "
            "required keyword-only argument: 'batches')") in result.stderr, result.stderr
