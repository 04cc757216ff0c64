"""The tiny experiment materialized twice, as `make run` does: once per test run, shared by the end-to-end tests.

Under pytest-xdist the workers share it: the first to ask builds it under a lock in the test
run's own temporary directory, the others wait for it and read the same stores. Tests only read
it; a test that writes (a backfill, the UI's runs) works on a copy (`pipeline_copy`).
"""

import contextlib
import io
import json
import shutil
import warnings
from pathlib import Path

import pytest
from dagster import DagsterInstance, PreviewWarning
from filelock import FileLock

from assets.execution import failure_messages
from assets.run import run_experiment
from factory.cli.common import dagster_home
from factory.config import load
from factory.registry import ArtifactStore

BUILT = "pipeline.json"
TINY_SLICE = """data:
  datasets:
    stdlib:
      source: {include: ["json/**/*.py", "email/**/*.py"]}
    site_packages:
      source: {include: ["click/**/*.py"]}
tokenizer: {vocab_size: 512, sample_bytes: 200000}
"""
"""The tiny recipe's data cut to a few packages, with a tokenizer to match: for a recipe that extends it and tests what
happens after the data (its lines go under `extends:` in the front matter)."""


def objects_but_reports(registry: ArtifactStore) -> list[str]:
    """Digests of the published artifacts, run reports aside (a report describes its own run: which stages were cache hits)."""
    return sorted({manifest.digest for manifest in registry.manifests() if manifest.kind != "run_report"})


def shared_directory(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A directory of this test run that every xdist worker sees (the run's base temp; a worker's own is inside it)."""
    base = tmp_path_factory.getbasetemp()
    return base if worker_id == "master" else base.parent


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory, tiny_path, worker_id):
    """tiny-code-lm run twice on one persistent instance under a fresh root, built once per test run: `make run` as a
    user runs it, about a minute alone and two under the whole suite (its first reader's setup shows it)."""
    warnings.filterwarnings("ignore", category=PreviewWarning)
    shared = shared_directory(tmp_path_factory, worker_id)
    root = shared / "pipeline"
    with FileLock(str(shared / "pipeline.lock")):
        if not (shared / BUILT).exists():
            instance = DagsterInstance.from_config(str(dagster_home(root)))
            first = run_experiment(tiny_path, root, instance)
            assert first.success, failure_messages(first)
            objects = objects_but_reports(ArtifactStore(root / "registry"))
            said = io.StringIO()
            with contextlib.redirect_stderr(said):
                second = run_experiment(tiny_path, root, instance)
            assert second.success, failure_messages(second)
            (shared / BUILT).write_text(json.dumps({"objects_after_first": objects, "second_run_stderr": said.getvalue()}))
    built = json.loads((shared / BUILT).read_text())
    instance = DagsterInstance.from_config(str(dagster_home(root)))
    return {"instance": instance, "root": root, "objects_after_first": built["objects_after_first"], "name": load(tiny_path).name,
            "source": tiny_path, "second_run_stderr": built["second_run_stderr"]}


@pytest.fixture
def pipeline_copy(pipeline, tmp_path) -> Path:
    """A root of the shared pipeline's stores for a test that writes to them: the others read the original."""
    root = tmp_path / "copy"
    shutil.copytree(pipeline["root"], root)
    return root
