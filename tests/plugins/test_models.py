"""A model architecture installed as a plugin (`model_factory.models`): `model.arch` picks it, the factory builds and exports
it through the registry, and a broken or clashing one is refused at load time naming it."""

import os
import subprocess
import sys

from tests.plugins.conftest import REPO, factory_with, fake_package

GROUP = "model_factory.models"
TINY = REPO / "experiments" / "tiny-code-lm.md"
BIGRAM = """\
from factory.config.architectures import ModelArch


def build(config, vocab_size):
    import torch  # only a process that builds the model pays for torch

    return torch.nn.Sequential(torch.nn.Embedding(vocab_size, config.n_embd), torch.nn.Linear(config.n_embd, vocab_size))


ARCH = ModelArch(name={name!r}, description="each token predicts the next alone", build="{module}:build")
"""
BUILD = """\
import sys
from pathlib import Path
import torch
from factory.config.schema import ModelConfig
from factory.models.build import build_model, export_model
config = ModelConfig(arch="bigram", n_layer=1, n_head=2, n_embd=16, context=8)
model = build_model(config, 40, seed=0)
print(type(model).__name__, tuple(model(torch.zeros(2, 5, dtype=torch.long)).shape))
export_model(config, model.state_dict(), Path(sys.argv[1]))
"""


def experiment(tmp_path, arch: str):
    """The tiny experiment with `model.arch: arch`."""
    path = tmp_path / "exp.md"
    path.write_text(TINY.read_text().replace("model:\n", f"model:\n  arch: {arch}\n", 1))
    return path


def test_a_plugin_architecture_is_checked_built_and_exported(tmp_path):
    site = fake_package(tmp_path / "site", "bigram_arch", BIGRAM.format(name="bigram", module="bigram_arch"),
                        {"bigram": "bigram_arch:ARCH"}, group=GROUP)
    checked = factory_with(site, "check", str(experiment(tmp_path, "bigram")))
    assert checked.returncode == 0, checked.stderr
    refused = factory_with(None, "check", str(experiment(tmp_path, "bigram")))
    assert refused.returncode == 2 and "unknown model architecture 'bigram'; known architectures: gpt" in refused.stderr
    out = tmp_path / "out"
    out.mkdir()
    built = subprocess.run([sys.executable, "-c", BUILD, str(out)], capture_output=True, text=True, cwd=REPO, timeout=300,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])})
    assert built.returncode == 0, built.stderr
    assert built.stdout.split() == ["Sequential", "(2,", "5,", "40)"]
    assert sorted(p.name for p in out.iterdir()) == ["model.pt", "model.safetensors"]


def test_an_unknown_arch_names_the_file_line_and_the_known_architectures(tmp_path):
    path = experiment(tmp_path, "mamba")
    result = factory_with(None, "check", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{path}:24:" in result.stderr and "unknown model architecture 'mamba'; known architectures: gpt" in result.stderr, result.stderr


def test_an_architecture_plugin_that_fails_to_import_is_named_with_its_error(tmp_path):
    site = fake_package(tmp_path, "broken_arch", "import no_such_module\n", {"bigram": "broken_arch:ARCH"}, group=GROUP)
    result = factory_with(site, "check", str(TINY))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert ("error: plugin 'bigram' (broken_arch:ARCH of package broken-arch) failed to import (ModuleNotFoundError: No module "
            "named 'no_such_module'); fix the package or uninstall it") in result.stderr, result.stderr


def test_an_architecture_plugin_that_claims_gpt_or_names_another_is_refused(tmp_path):
    fake_package(tmp_path, "clash_arch", BIGRAM.format(name="gpt", module="clash_arch") + "NOT_AN_ARCH = 3\n",
                 {"gpt": "clash_arch:ARCH"}, group=GROUP)
    result = factory_with(tmp_path, "check", str(TINY))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert ("plugin 'gpt' (clash_arch:ARCH of package clash-arch) declares the model architecture 'gpt', which built in "
            "declares already; rename one of them") in result.stderr, result.stderr
    odd = fake_package(tmp_path / "odd", "odd_arch", BIGRAM.format(name="bigram", module="odd_arch") + "NOT_AN_ARCH = 3\n",
                       {"bigram": "odd_arch:NOT_AN_ARCH"}, group=GROUP)
    result = factory_with(odd, "check", str(TINY))
    assert result.returncode == 2 and "plugin 'bigram' (odd_arch:NOT_AN_ARCH of package odd-arch) names a int, not a ModelArch" in result.stderr
