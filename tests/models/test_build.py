"""Models built and exported through the registry: the GPT, seeded, and its export files."""

import json

import torch
from safetensors.torch import load_file

from factory.config.schema import ModelConfig
from factory.models.build import build_model, count_parameters, export_model
from factory.models.export import export_weights
from factory.models.gpt import GPT

CONFIG = ModelConfig(n_layer=1, n_head=2, n_embd=32, context=16)
VOCAB = 50


def metadata(path) -> dict:
    size = int.from_bytes(path.read_bytes()[:8], "little")
    return json.loads(path.read_bytes()[8 : 8 + size])["__metadata__"]


def test_the_default_arch_builds_a_gpt_and_counts_tied_weights_once():
    model = build_model(CONFIG, VOCAB, seed=0)
    assert isinstance(model, GPT) and count_parameters(model) == model.num_parameters()


def test_a_gpt_exports_its_weights_with_the_tied_projection_stored_once(tmp_path):
    weights = build_model(CONFIG, VOCAB, seed=0).state_dict()
    export_model(CONFIG, weights, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt", "model.safetensors"]
    stored = load_file(tmp_path / "model.safetensors")
    assert "lm_head.weight" not in stored and torch.equal(stored["wte.weight"], weights["wte.weight"])
    assert metadata(tmp_path / "model.safetensors") == {"format": "pt", "tied_embeddings": "true"}
    assert torch.load(tmp_path / "model.pt", weights_only=True).keys() == weights.keys()


def test_the_generic_export_stores_shared_tensors_once_and_names_them(tmp_path):
    weights = build_model(CONFIG, VOCAB, seed=0).state_dict()
    export_weights(weights, tmp_path)
    assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors")
    assert json.loads(metadata(tmp_path / "model.safetensors")["shared"]) == {"lm_head.weight": "wte.weight"}


def test_an_export_is_the_same_bytes_twice(tmp_path):
    weights = build_model(CONFIG, VOCAB, seed=3).state_dict()
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        export_model(CONFIG, weights, tmp_path / name)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
