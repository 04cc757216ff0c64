"""A llama-arch recipe through Dagster, as `factory run` runs it: `experiments/tiny-llama.md` trains on the tiny
pipeline's cached data and tokenizer, and its model stage publishes a directory `transformers` loads and generates from."""

import os
from pathlib import Path

import pytest
import torch
from dagster import DagsterInstance

from assets.execution import failure_messages
from assets.run import run_experiment
from factory.cli.common import dagster_home
from factory.config.schema import ModelConfig
from factory.models.build import new_model
from factory.models.generate import generate
from factory.models.sampling import Sampling
from factory.models.tokenizer import load_tokenizer
from factory.registry import ArtifactStore
from factory.train.pretrain import load_weights

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
TINY_LLAMA = REPO / "experiments" / "tiny-llama.md"


def test_tiny_llama_publishes_a_model_transformers_loads_and_generates_from(pipeline_copy, monkeypatch):
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    root = pipeline_copy  # the tiny pipeline's stores: its data stages and tokenizer are cache hits here
    instance = DagsterInstance.from_config(str(dagster_home(root)))
    result = run_experiment(TINY_LLAMA, root, instance)
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
