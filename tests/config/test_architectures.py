"""The model-architecture registry: GPT built in, `model.arch` validated against it, and left out of dumps (so fingerprints)
when it is the default."""

import pytest

from factory.config import load
from factory.config.architectures import DEFAULT_ARCH, architecture, architectures
from factory.config.schema import ModelConfig
from factory.errors import ConfigError


def test_gpt_is_built_in_and_the_default():
    assert [a.name for a in architectures()] == ["gpt", "llama"]
    assert architecture("gpt").origin == "built in" and ModelConfig().arch == DEFAULT_ARCH == "gpt"


def test_an_unknown_architecture_is_refused_naming_the_known_ones():
    with pytest.raises(ConfigError, match="unknown model architecture 'mamba'; known architectures: gpt, llama"):
        architecture("mamba")


def test_an_unknown_arch_in_an_experiment_file_is_its_file_and_line(tmp_path):
    path = tmp_path / "exp.md"
    path.write_text("---\nmodel:\n  n_layer: 2\n  arch: mamba\n---\n")
    with pytest.raises(ConfigError) as failed:
        load(path)
    message = str(failed.value)
    assert message.startswith(f"{path}:4:") and "model.arch" in message, message
    assert "unknown model architecture 'mamba'; known architectures: gpt, llama" in message


def test_the_default_arch_is_left_out_of_the_dump_so_fingerprints_stay_as_they_were(tmp_path):
    named = ModelConfig(arch="gpt", n_layer=2)
    assert "arch" not in named.model_dump(mode="json") and named.model_dump() == ModelConfig(n_layer=2).model_dump()
    path = tmp_path / "exp.md"
    path.write_text("---\nmodel: {arch: gpt, n_layer: 2}\n---\n")
    assert load(path).model.arch == "gpt" and "arch" not in load(path).model_dump(mode="json")["model"]


def write(tmp_path, model: str):
    path = tmp_path / "exp.md"
    path.write_text(f"---\nmodel:\n  n_layer: 2\n{model}---\n")
    return path


def test_a_llama_has_rotary_positions_and_its_options_left_out_of_the_dump_at_their_defaults(tmp_path):
    model = load(write(tmp_path, "  arch: llama\n  n_kv_head: 2\n")).model
    assert model.positions == "rotary" and model.kv_heads == 2 and model.rope_theta == 10_000.0
    assert model.model_dump(mode="json") == {"arch": "llama", "n_layer": 2, "n_head": 4, "n_embd": 256, "context": 256, "dropout": 0.0,
                                             "tie_embeddings": True, "positions": "rotary", "n_kv_head": 2}
    assert ModelConfig.model_validate(model.model_dump(mode="json")) == model
    assert ModelConfig(arch="llama", n_embd=64).mlp_width == 192 and ModelConfig(arch="llama", intermediate_size=100).mlp_width == 100


@pytest.mark.parametrize(("model", "line", "says"), [
    ("  arch: llama\n  n_kv_head: 3\n", 2, "n_head (4) must be divisible by n_kv_head (3)"),
    ("  arch: llama\n  n_head: 6\n  n_embd: 66\n", 2, "rotary positions need an even head width; n_embd / n_head is 11"),
    ("  arch: llama\n  n_embd: 66\n", 2, "n_embd (66) must be divisible by n_head (4)"),
    ("  arch: llama\n  positions: learned\n", 2, "positions is 'learned', but arch llama always has positions 'rotary'"),
    ("  n_kv_head: 2\n", 2, "n_kv_head is 2, but it does not apply to arch gpt"),
    ("  rope_theta: 500000\n", 2, "rope_theta is 500000.0, but it does not apply to arch gpt"),
    ("  arch: llama\n  rope_theta: 0\n", 5, "model.rope_theta"),
])
def test_a_shape_that_does_not_fit_names_the_file_line_and_what_to_change(tmp_path, model, line, says):
    path = write(tmp_path, model)
    with pytest.raises(ConfigError) as failed:
        load(path)
    message = str(failed.value)
    assert message.startswith(f"{path}:{line}:") and says in message, message
