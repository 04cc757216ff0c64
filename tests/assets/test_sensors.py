"""The git sensor: files at HEAD become partitions and run requests keyed by path + content hash."""

import subprocess

from dagster import DagsterInstance, SkipReason, build_sensor_context

from assets.sensors import experiments_at_head
from factory.config import load
from resources import ExperimentFiles, FactoryStores

SWEEP = """---
extends: base.md
sweep:
  pretrain.lr: [0.001, 0.003]
  tokenizer.vocab_size: [512, 1024]
---
A 2x2 grid.
"""


def git(repo, *args):
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True, capture_output=True)


def tick(instance, directory, cursor=None):
    resources = {"experiments": ExperimentFiles(directory=str(directory)), "stores": FactoryStores(root=str(directory.parent / ".factory"))}
    context = build_sensor_context(instance=instance, cursor=cursor, resources=resources)
    return experiments_at_head(context)


def test_sensor_requests_runs_for_new_and_changed_files_at_head(tmp_path, tiny_path):
    repo, experiments = tmp_path / "repo", tmp_path / "repo" / "experiments"
    experiments.mkdir(parents=True)
    git(repo, "init", "-q")
    (experiments / "base.md").write_text(tiny_path.read_text())
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    instance = DagsterInstance.ephemeral()

    first = tick(instance, experiments)
    [request] = first.run_requests
    assert request.partition_key == "base" and request.run_key.startswith("base.md@")
    assert {k.to_user_string() for k in request.asset_selection} == set(load(tiny_path).stages())
    assert first.dynamic_partitions_requests[0].partition_keys == ["base"]
    assert isinstance(tick(instance, experiments, cursor=first.cursor), SkipReason)

    (experiments / "sweep.md").write_text(SWEEP)
    (experiments / "broken.md").write_text("---\nmodel: [1\n---\n")
    (experiments / "refused.md").write_text("---\nextends: base.md\neval:\n  benchmarks: [no_such_benchmark]\n---\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "sweep")
    (experiments / "base.md").write_text("uncommitted edits are not run\n")
    second = tick(instance, experiments, cursor=first.cursor)
    keys = {r.partition_key: r.run_key for r in second.run_requests}
    assert keys["base"] == request.run_key  # unchanged at HEAD: Dagster skips a run key it has seen
    assert "refused" not in keys  # loads, but `factory check` refuses it: never started
    sweep_keys = sorted(k for k in keys if k != "base")
    assert sweep_keys == [f"sweep.lr={lr}.vocab_size={v}" for lr in ("0.001", "0.003") for v in ("1024", "512")]
    assert all("|" not in key for key in keys)
    assert second.cursor != first.cursor


def test_sensor_skips_outside_git(tmp_path):
    assert isinstance(tick(DagsterInstance.ephemeral(), tmp_path), SkipReason)
