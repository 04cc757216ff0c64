"""A llama-arch recipe through Dagster, as `factory run` runs it: `experiments/tiny-llama.md` (shortened) trains on the
tiny pipeline's cached data and tokenizer, and its model stage publishes a directory `transformers` loads and generates from."""

import json
import os
from pathlib import Path

import pytest
import torch
from dagster import AssetKey, DagsterInstance

from assets.execution import failure_messages
from assets.run import run_experiment
from factory.cli.common import dagster_home
from factory.config.schema import ModelConfig
from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.tables import content_of
from factory.models.build import new_model
from factory.models.generate import generate
from factory.models.sampling import Sampling
from factory.models.tokenizer import load_tokenizer
from factory.registry import ArtifactStore
from factory.train.pretrain import load_weights

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
TINY_LLAMA = REPO / "experiments" / "tiny-llama.md"
SHORTER = """---
extends: {recipe}
pretrain: {{steps: 60, warmup_steps: 10, checkpoint_every: 0}}
eval: null
---
tiny-llama as shipped, trained for 60 steps of its 300 and not evaluated: what is tested is its model's export.
"""


def test_tiny_llama_publishes_a_model_transformers_loads_and_generates_from(pipeline_copy, tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    root = pipeline_copy  # the tiny pipeline's stores: its data stages and tokenizer are cache hits here
    recipe = tmp_path / "experiments" / TINY_LLAMA.name  # the same name, so the same experiment
    recipe.parent.mkdir()
    recipe.write_text(SHORTER.format(recipe=TINY_LLAMA))
    instance = DagsterInstance.from_config(str(dagster_home(root)))
    result = run_experiment(recipe, root, instance)
    assert result.success, failure_messages(result)
    registry = ArtifactStore(root / "registry")
    [pretrain] = [m for m in registry.manifests("pretrain") if m.experiment == "tiny-llama"]
    [made] = [m for m in registry.manifests("model") if m.experiment == "tiny-llama"]
    tokenizers = {m.digest for m in registry.manifests("tokenizer")}
    assert len(tokenizers) == 1 and made.inputs == {"pretrain": pretrain.digest, "tokenizer": tokenizers.pop()}  # shared, not retrained
    assert made.summary["hugging_face"] == "LlamaForCausalLM"
    directory = registry.path(made.digest)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= set(os.listdir(directory))

    loaded = transformers.AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
    assert type(loaded).__name__ == "LlamaForCausalLM" and loaded.config.num_key_value_heads == 2
    prompt = "def read_json(path):\n    with open(path) as f:\n"
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    assert ids[0].tolist() == load_tokenizer(directory / "tokenizer.json").encode(prompt).ids
    theirs = loaded.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=None, attention_mask=torch.ones_like(ids))
    config = ModelConfig.model_validate(loaded.config.model)
    ours = new_model(config, loaded.config.vocab_size)
    ours.load_state_dict(load_weights(directory / "model.pt"))
    continuation = theirs[0, ids.size(1) :].tolist()
    assert len(continuation) == 24 and continuation == list(generate(ours.eval(), [ids[0].tolist()], Sampling(new_tokens=24), context=config.context)[0].tokens)
    text = tokenizer.decode(continuation, skip_special_tokens=True)
    assert text and text == load_tokenizer(directory / "tokenizer.json").decode(continuation)


SFT_ON_CHATS = "sft: {steps: 4, batch_size: 4, lr: 0.001, log_every: 1, data: {dataset: chat, format: messages}}"
SCORED_ON_HUMANEVAL = (", checkpoint_every: 4, checkpoint_at_start: true}\n"
                       "eval: {benchmarks: [humaneval.quick], primary: humaneval.quick, batch_size: 8}")
"""The imported model scored before its fine-tuning (step 0) and after, on the first 20 HumanEval problems (seconds)."""
PRETRAIN_ON_CODE = "pretrain: {steps: 3, batch_size: 4, lr: 0.001, warmup_steps: 1, checkpoint_every: 0, log_every: 1}"


def test_a_checkpoint_transformers_saved_is_fine_tuned_continued_and_exported_back(tmp_path, monkeypatch):
    """`model.from_hf`: fine-tuned (sft on chats) and pretrained further, through Dagster; the exported model loads in
    `transformers` with the checkpoint's tokenizer and end-of-text token; lineage names the checkpoint as an external input."""
    from factory.ops.lineage import Lineage
    from tests.models.hf_checkpoints import IMPORTED, TEXTS, save_llama, write_sources

    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("FACTORY_DATA_ROOTS", str(tmp_path))
    original = save_llama(tmp_path / "hf").state_dict()
    write_sources(tmp_path)
    files = {}
    tuned_and_scored = SFT_ON_CHATS.removesuffix("}") + SCORED_ON_HUMANEVAL
    for name, training, what in (("imported", tuned_and_scored, "fine-tuned on chats"), ("continued", PRETRAIN_ON_CODE, "pretrained further")):
        files[name] = tmp_path / f"{name}.md"
        files[name].write_text(IMPORTED.format(root=tmp_path, training=training, what=what).replace("context: 64", "context: 128"))
    root = tmp_path / "factory"
    instance = DagsterInstance.from_config(str(dagster_home(root)))
    result = run_experiment(files["imported"], root, instance)
    assert result.success, failure_messages(result)

    registry = ArtifactStore(root / "registry")
    [tokenizer] = registry.manifests("tokenizer")
    [sft] = registry.manifests("sft")
    [made] = registry.manifests("model")
    from_hf = sft.config["model"]["from_hf"]
    assert tokenizer.config == {"from_hf": from_hf} and from_hf["path"] == str(tmp_path / "hf")
    assert tokenizer.summary["eos_token"] == "</s>" and sft.summary["started_from"] == "from_hf" and "pretrain" not in sft.inputs
    directory = registry.path(made.digest)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype=torch.float32).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
    assert hf_tokenizer.eos_token == "</s>" and loaded.generation_config.eos_token_id == hf_tokenizer.eos_token_id
    assert hf_tokenizer.chat_template == (registry.path(sft.digest) / "chat_template.jinja").read_text()  # as it was fine-tuned
    assert hf_tokenizer(TEXTS[5])["input_ids"] == load_tokenizer(tmp_path / "hf" / "tokenizer.json").encode(TEXTS[5]).ids
    tuned = loaded.state_dict()
    assert all(tuned[name].shape == tensor.shape and tuned[name].dtype == tensor.dtype for name, tensor in original.items())
    assert not torch.equal(tuned["model.layers.0.mlp.up_proj.weight"], original["model.layers.0.mlp.up_proj.weight"])  # trained
    ours = new_model(ModelConfig.model_validate(loaded.config.model), loaded.config.vocab_size)
    ours.load_state_dict(load_weights(directory / "model.pt"))
    ids = torch.tensor([hf_tokenizer(TEXTS[9])["input_ids"]])
    with torch.no_grad():
        assert (ours.eval()(ids) - loaded(ids).logits).abs().max().item() <= 1e-5
    [imported] = Lineage(registry).imported(made.digest)
    assert imported == {"path": str(tmp_path / "hf"), "files": from_hf["files"], "read_by": ["tokenizer (imported)", "sft (imported)"]}
    scores = {(m.summary["benchmark"], m.summary["step"]): m for m in registry.manifests("evaluations")}
    assert set(scores) == {("humaneval.quick", 0), ("humaneval.quick", 4)}  # before its fine-tuning and after
    content = content_of(open_catalog(CatalogConfig.local(root / "iceberg")), "eval.humaneval@v1")
    assert {m.summary["data"] for m in scores.values()} == {f"eval.humaneval@v1#{content}"}
    quick = json.loads((registry.path(scores[("humaneval.quick", 4)].digest) / "result.json").read_text())["details"]
    assert quick["problems"] == 20 and len(quick["results"]) == 20 and quick["new_tokens"] > 0
    assert instance.get_latest_materialization_event(AssetKey("humaneval_problems")) is not None

    result = run_experiment(files["continued"], root, instance)
    assert result.success, failure_messages(result)
    assert [m.digest for m in registry.manifests("tokenizer")] == [tokenizer.digest]  # the same checkpoint's tokenizer: reused
    [pretrain] = registry.manifests("pretrain")
    [continued] = [m for m in registry.manifests("model") if m.experiment == "continued"]
    weights = load_weights(registry.path(continued.digest) / "model.pt")
    moved = max((weights[name.removeprefix("model.")] - tensor).abs().max().item() for name, tensor in original.items())
    assert 0 < moved < 0.02  # three small steps from the checkpoint's weights, not from a fresh initialisation
    assert [c["read_by"] for c in Lineage(registry).imported(continued.digest)] == [["tokenizer (imported)", "pretrain (continued)"]]
