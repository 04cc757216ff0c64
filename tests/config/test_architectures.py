"""The model-architecture registry: GPT built in, `model.arch` validated against it, and left out of dumps (so fingerprints)
when it is the default."""

import pytest

from factory.config import load
from factory.config.architectures import DEFAULT_ARCH, architecture, architectures
from factory.config.schema import ModelConfig
from factory.errors import ConfigError


def test_gpt_is_built_in_and_the_default():
    assert [a.name for a in architectures()] == ["gpt"]
    assert architecture("gpt").origin == "built in" and ModelConfig().arch == DEFAULT_ARCH == "gpt"


def test_an_unknown_architecture_is_refused_naming_the_known_ones():
    with pytest.raises(ConfigError, match="unknown model architecture 'mamba'; known architectures: gpt"):
        architecture("mamba")


def test_an_unknown_arch_in_an_experiment_file_is_its_file_and_line(tmp_path):
    path = tmp_path / "exp.md"
    path.write_text("---\nmodel:\n  n_layer: 2\n  arch: mamba\n---\n")
    with pytest.raises(ConfigError) as failed:
        load(path)
    message = str(failed.value)
    assert message.startswith(f"{path}:4:") and "model.arch" in message, message
    assert "unknown model architecture 'mamba'; known architectures: gpt" in message


def test_the_default_arch_is_left_out_of_the_dump_so_fingerprints_stay_as_they_were(tmp_path):
    named = ModelConfig(arch="gpt", n_layer=2)
    assert "arch" not in named.model_dump(mode="json") and named.model_dump() == ModelConfig(n_layer=2).model_dump()
    path = tmp_path / "exp.md"
    path.write_text("---\nmodel: {arch: gpt, n_layer: 2}\n---\n")
    assert load(path).model.arch == "gpt" and "arch" not in load(path).model_dump(mode="json")["model"]
