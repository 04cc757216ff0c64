"""Stages run for real, in this process and in order, on one dataset read from a directory of files."""

from pathlib import Path
from typing import Any

import pytest
from dagster_pipes import DAGSTER_PIPES_CONTEXT_ENV_VAR

from factory.config import UPSTREAM, load, plan_stage
from factory.data.catalog import CatalogConfig
from factory.registry.store import ArtifactStore, Provenance
from factory.runtime.__main__ import main
from factory.runtime.request import StageRequest


@pytest.fixture
def no_pipes(monkeypatch):
    """Stages report to the console, as when run by hand."""
    monkeypatch.delenv(DAGSTER_PIPES_CONTEXT_ENV_VAR, raising=False)


def run_stages(tmp_path: Path, tiny_path: Path, files: dict[str, str], label: str, last: str, dataset: dict[str, Any] | None = None,
               last_fails: bool = False, **sections: Any) -> dict[str, Path]:
    """Write `files` under `tmp_path/label`, read them as dataset `code` of the tiny experiment (its `dataset` settings and
    other `sections` replaced), and run every stage up to `last` against one registry and catalog in `tmp_path`; each
    stage's artifact directory. With `last_fails`, the last stage must exit 1 and publish nothing."""
    source = tmp_path / label
    for rel, text in files.items():
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        (source / rel).write_text(text)
    tiny = load(tiny_path)
    data = tiny.data.model_validate({"datasets": {"code": {"source": {"kind": "directory", "path": str(source)}, **(dataset or {})}}})
    experiment = tiny.model_copy(update={"data": data, **{name: getattr(tiny, name).model_validate(value) for name, value in sections.items()}})
    registry = ArtifactStore(tmp_path / "registry")
    digests: dict[str, str] = {}
    for kind in list(UPSTREAM)[: list(UPSTREAM).index(last) + 1]:
        spec = plan_stage(experiment, kind, digests)
        request = StageRequest(spec=spec, registry=str(registry.root), catalog=CatalogConfig.local(tmp_path / "catalog"),
                               provenance=Provenance(experiment="tiny-code-lm", config_hash="0" * 16, git_commit="test"))
        failing = last_fails and kind == last
        assert main([str(request.write(tmp_path / f"{label}-{kind}.json"))]) == (1 if failing else 0), kind
        if failing:
            assert registry.lookup(spec.fingerprint) is None, f"{kind} failed, yet published"
            break
        digests[kind] = registry.lookup(spec.fingerprint).digest
    return {kind: registry.path(digest) for kind, digest in digests.items()}
