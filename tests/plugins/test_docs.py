"""docs/plugins.md as an outside engineer follows it: the page's files (its code blocks marked `file=`) written out, its
four packages installed by pip, its experiment file checked, planned and run with them, its training kind's batch source
resumed and split over ranks; so the page cannot drift from the plugin API."""

import ast
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from factory.config.model_section import ModelConfig
from factory.config.source_cache import CACHE_ENV, TREES
from factory.plugin import TrainingInputs
from factory.registry import ArtifactStore
from factory.train.distributed import World
from tests.plugins.conftest import REPO, factory_with, pip_installed

PAGE = REPO / "docs" / "plugins.md"
FILE_BLOCK = re.compile(r"^```\w+ file=(\S+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
EXPERIMENT = "house-style.md"
PINNED = re.compile(r'sha256: "(?P<sha256>[0-9a-f]{64})"')
GROUPS = {"model_factory.stages", "model_factory.sources", "model_factory.models", "model_factory.benchmarks"}
BUILD = """\
import torch
from factory.config.schema import ModelConfig
from factory.models.build import build_model
model = build_model(ModelConfig(arch="gru", n_layer=2, n_head=2, n_embd=16, context=8), 40, seed=0)
print(type(model).__name__, tuple(model(torch.zeros(3, 5, dtype=torch.long)).shape))
"""


def page_files() -> dict[str, str]:
    """The page's files by path, as its marked code blocks give them."""
    return dict(FILE_BLOCK.findall(PAGE.read_text()))


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    """The page's files written out, and the data its experiment file reads: `data/library` (a library's code) and
    `data/house-style.zip` (another library's, zipped), whose sha256 the file then pins as the page says to."""
    directory = tmp_path_factory.mktemp("plugins-page")
    for path, text in page_files().items():
        (directory / path).parent.mkdir(parents=True, exist_ok=True)
        (directory / path).write_text(text)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    shutil.copytree(stdlib / "email", directory / "data" / "library", ignore=shutil.ignore_patterns("__pycache__"))
    archive = directory / "data" / "house-style.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        for module in sorted((stdlib / "json").glob("*.py")):
            zipped.write(module, f"json/{module.name}")
    experiment = directory / EXPERIMENT
    text, pins = PINNED.subn(f'sha256: "{hashlib.sha256(archive.read_bytes()).hexdigest()}"', experiment.read_text())
    assert pins == 1, f"{EXPERIMENT} on the page pins no archive"
    experiment.write_text(text)
    return directory


@pytest.fixture(scope="module")
def site(written, tmp_path_factory) -> Path:
    """The page's packages (each directory with a pyproject.toml), installed by pip into a directory of their own."""
    return pip_installed(tmp_path_factory.mktemp("plugins-page-site"), *sorted(p.parent for p in written.glob("*/pyproject.toml")))


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    """The factory's cache (the unpacked archives) in the test's directory, for the processes it starts."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_pages_packages_declare_one_plugin_of_each_group_and_import_the_factory_only_through_factory_plugin():
    files = page_files()
    groups = [group for path, text in files.items() if path.endswith("pyproject.toml")
              for group in tomllib.loads(text)["project"]["entry-points"]]
    assert sorted(groups) == sorted(GROUPS)
    for path, text in files.items():
        if path.endswith(".py"):
            imported = {node.module for node in ast.walk(ast.parse(text)) if isinstance(node, ast.ImportFrom)}
            imported |= {alias.name for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Import) for alias in node.names}
            assert {name for name in imported if name.split(".")[0] == "factory"} == {"factory.plugin"}, path


def test_the_experiment_file_checks_and_plans_with_the_plugins_installed(site, written, tmp_path, cache):
    checked = factory_with(site, "check", EXPERIMENT, cwd=written)
    assert checked.returncode == 0 and f"ok  {EXPERIMENT}" in checked.stdout, checked.stdout + checked.stderr
    plan = factory_with(site, "plan", EXPERIMENT, "--root", str(tmp_path / "state"), cwd=written)
    assert plan.returncode == 0, plan.stderr
    assert "pretrain x1, smooth x1, model x1" in plan.stdout, plan.stdout
    pinned = PINNED.search((written / EXPERIMENT).read_text()).group("sha256")
    assert (cache / TREES / "zip" / pinned / "json" / "decoder.py").is_file()  # planning listed the archive's files: unpacked
    refused = factory_with(None, "check", EXPERIMENT, cwd=written)
    assert refused.returncode == 2 and "unknown source kind 'zip'" in refused.stderr, refused.stderr


def test_the_benchmark_is_listed_and_the_architecture_builds_through_the_registry(site):
    listed = factory_with(site, "evals", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    top5 = next(b for b in json.loads(listed.stdout) if b["name"] == "top5")
    assert top5["better"] == "higher" and top5["code"].startswith("plugin:")
    built = subprocess.run([sys.executable, "-c", BUILD], capture_output=True, text=True, cwd=REPO, timeout=300,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])})
    assert built.stdout.split() == ["GRULanguageModel", "(3,", "5,", "40)"], built.stderr


@pytest.mark.e2e
def test_the_experiment_file_runs_and_an_edit_of_the_training_kind_reruns_only_what_it_computes(site, written, tmp_path, monkeypatch):
    site = Path(shutil.copytree(site, tmp_path / "site"))  # edited below: the other tests keep theirs
    root = str(tmp_path / "state")
    run = factory_with(site, "run", EXPERIMENT, "--root", root, cwd=written)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    registry = ArtifactStore(tmp_path / "state" / "registry")
    [smooth] = registry.manifests("smooth")
    assert smooth.summary["started_from"] == "pretrain" and smooth.summary["steps"] == 10 and smooth.summary["windows"] > 0
    assert "model-factory-smooth:" in smooth.code and "model-factory-gru:" in smooth.code
    scored = {(m.summary["benchmark"], m.summary["checkpoint"]) for m in registry.manifests("evaluations")}
    assert ("top5", "house-style__smooth-000010") in scored and ("top5", "house-style__pretrain-000010") in scored
    board = json.loads(factory_with(site, "leaderboard", "--json", "--root", root).stdout)
    assert [row["checkpoint"] for row in board["rows"]] == ["house-style__smooth-000010"]  # the model stage exported smooth's

    with (site / "factory_smooth.py").open("a") as module:
        module.write("# edited\n")
    monkeypatch.setenv("COLUMNS", "300")  # the plan's table on one line a stage
    plan = factory_with(site, "plan", EXPERIMENT, "--root", root, cwd=written)
    assert plan.returncode == 0, plan.stderr
    assert "will compute: smooth x1, model x1" in plan.stdout, plan.stdout
    assert re.search(r"│ smooth\s+│ run\s+│.*│ code: model-factory-smooth changed", plan.stdout), plan.stdout


def smooth_inputs(written: Path, world: World) -> tuple[TrainingInputs, object]:
    """The page's training kind module, and what its batch source is built from: 5 documents of words, context 8."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    spec = importlib.util.spec_from_file_location("page_smooth", written / "smooth" / "factory_smooth.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    words = [f"w{i}" for i in range(40)]
    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    texts = [" ".join(words[i:i + 3 + 4 * i]) for i in range(5)]  # 3 to 19 words: short windows padded, long ones split
    section = module.SmoothConfig(dataset="house", steps=5, batch_size=4)
    return TrainingInputs(ctx=None, start="", settings=SimpleNamespace(seed=3), section=section, tokenizer=tokenizer, eos_id=39, world=world,
                          model=ModelConfig(n_layer=1, n_head=1, n_embd=8, context=8), log=logging.getLogger("smooth"),
                          rows=lambda dataset, columns: [{"text": text} for text in texts]), module


def test_the_pages_batch_source_resumes_exactly_and_splits_a_global_batch_over_ranks(written):
    import torch

    inputs, module = smooth_inputs(written, World())
    whole = module.batches(inputs)
    first = [batch for batch, _ in zip(whole(None), range(6))]  # past the first epoch: 6 x 4 windows of the 9 there are
    assert inputs.summary == {"windows": 9}
    resumed = [batch for batch, _ in zip(whole(first[2].state), range(3))]
    assert all(a.x.equal(b.x) and a.y.equal(b.y) and a.state == b.state for a, b in zip(first[3:], resumed, strict=True))
    halves = [next(module.batches(smooth_inputs(written, World(rank=rank, size=2))[0])(first[3].state)) for rank in (0, 1)]
    assert torch.cat([h.x for h in halves]).equal(first[4].x) and torch.cat([h.y for h in halves]).equal(first[4].y)
    assert halves[0].loss_units == halves[1].loss_units == first[4].loss_units == int((first[4].y != -1).sum())
