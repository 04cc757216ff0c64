"""The tiny experiment materialized twice, as `make run` does, shared by the end-to-end tests."""

import warnings

import pytest
from dagster import DagsterInstance, PreviewWarning

from assets.execution import failure_messages
from assets.run import run_experiment
from factory.cli import dagster_home
from factory.config import load
from factory.registry import ArtifactStore


def objects_but_reports(registry: ArtifactStore) -> list[str]:
    """Digests of the published artifacts, run reports aside (a report describes its own run: which stages were cache hits)."""
    return sorted({manifest.digest for manifest in registry.manifests() if manifest.kind != "run_report"})


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory, tiny_path):
    """Run tiny-code-lm twice on one persistent instance under a fresh root."""
    warnings.filterwarnings("ignore", category=PreviewWarning)
    root = tmp_path_factory.mktemp("factory")
    instance = DagsterInstance.from_config(str(dagster_home(root)))
    first = run_experiment(tiny_path, root, instance)
    assert first.success, failure_messages(first)
    objects = objects_but_reports(ArtifactStore(root / "registry"))
    second = run_experiment(tiny_path, root, instance)
    assert second.success, failure_messages(second)
    return {"instance": instance, "root": root, "objects_after_first": objects, "name": load(tiny_path).name, "source": tiny_path}
