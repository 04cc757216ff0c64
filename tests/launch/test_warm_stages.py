"""Stages forked from the warm interpreter write the same bytes as stages started cold: data, tokenizer, training, model."""

import shutil
import sys
import sysconfig
from pathlib import Path

import pytest

from factory.config import load_text, plan_stage, upstream_of
from factory.config.stages import stages_of
from factory.data.catalog import CatalogConfig
from factory.launch import LocalLauncher, stage_argv, warm_starts
from factory.registry import ArtifactStore, Provenance
from factory.runtime import every_warm_module
from factory.runtime.request import StageRequest
from factory.train.records import published

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(sys.platform != "linux", reason="the warm interpreter forks: Linux only")]
RECIPE = """\
---
seed: 11
data:
  datasets:
    src:
      source: {{kind: directory, path: "{source}"}}
  blend:
    - {{dataset: src, weight: 1}}
  validation_percent: 10
tokenizer: {{vocab_size: 300, min_frequency: 2, sample_bytes: 200000}}
model: {{n_layer: 1, n_head: 2, n_embd: 32, context: 32}}
pretrain: {{steps: 6, batch_size: 4, lr: 0.003, warmup_steps: 2, checkpoint_every: 3, keep_last: 2, log_every: 3}}
---
Small enough to train twice in a test.
"""


def run_stages(path: Path, root: Path, monkeypatch) -> dict[str, str]:
    """Every stage of the experiment as its own process, in order; the digest of each artifact (and of each checkpoint)."""
    monkeypatch.setenv("FACTORY_TRACKER", "none")
    [experiment] = load_text(path, path.read_text())
    root.mkdir()
    registry = ArtifactStore(root / "registry")
    digests: dict[str, str] = {}
    for kind in stages_of(experiment):
        spec = plan_stage(experiment, kind, {name: digests[name] for name in upstream_of(experiment, kind)})
        request = StageRequest(spec=spec, registry=str(registry.root), catalog=CatalogConfig.local(root / "iceberg"),
                               provenance=Provenance(experiment=experiment.name, config_hash="0" * 16, git_commit="test"))
        LocalLauncher().run(stage_argv(request.write(root / f"{kind}.json")), {}, kind)
        digests[kind] = registry.lookup(spec.fingerprint).digest
    for checkpoint in published(registry.path(digests["pretrain"])):
        digests[checkpoint.name] = checkpoint.sha256
    return digests


def test_forked_stages_write_the_bytes_cold_stages_write(tmp_path, monkeypatch):
    source = tmp_path / "source"
    shutil.copytree(Path(sysconfig.get_paths()["stdlib"]) / "json", source / "json", ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / "small.md"
    path.write_text(RECIPE.format(source=source))
    cold = run_stages(path, tmp_path / "cold", monkeypatch)
    with warm_starts(every_warm_module()) as warm:
        forked = run_stages(path, tmp_path / "warm", monkeypatch)
        assert warm is not None and warm.refused is None, warm.refused  # every stage was forked
    assert cold.keys() >= {"model", "step_000003.pt", "step_000006.pt"}
    training_logs = {"pretrain"}  # its artifact holds the metrics log, with timings; its checkpoints are compared instead
    assert {k: v for k, v in forked.items() if k not in training_logs} == {k: v for k, v in cold.items() if k not in training_logs}
