"""Lineage joins table versions and models through the roles the stage kinds declare, a plugin kind's as a built-in one's."""

import dataclasses
import json

import factory.config.kinds as kinds
import factory.config.stages as stages
from factory.config.kinds import StageKind, stage_kinds
from factory.ops.lineage import Lineage
from factory.registry.layout import DATASETS_FILE
from factory.registry.store import ArtifactStore, Provenance

SCRAPED = StageKind(name="scraped", description="web pages", run="scraped:run", writes_tables=True, group="data")
BUNDLE = StageKind(name="bundle", description="an exported bundle", run="bundle:run", reads=("scraped",), exports_model=True)


def test_lineage_joins_a_plugin_kinds_table_versions_and_finds_a_plugin_model(monkeypatch, tmp_path):
    registry_kinds = (*(dataclasses.replace(k, exports_model=False) for k in stage_kinds()), SCRAPED, BUNDLE)
    monkeypatch.setattr(kinds, "stage_kinds", lambda: registry_kinds)
    monkeypatch.setattr(stages, "stage_kinds", lambda: registry_kinds)
    registry = ArtifactStore(tmp_path)

    def publish(kind: str, files: dict[str, str], inputs: dict[str, str]) -> str:
        with registry.staging() as out:
            for name, text in files.items():
                (out / name).write_text(text)
            return registry.publish(out, kind=kind, fingerprint=kind * 8, config={}, inputs=inputs, code="local:x",
                                    provenance=Provenance(experiment="web", config_hash="h", git_commit="c"), summary={}).digest

    written = {"docs": {"table": "scraped.docs", "tag": "v1", "content_tag": "abc"}}
    scraped = publish("scraped", {DATASETS_FILE: json.dumps(written)}, {})
    bundle = publish("bundle", {"weights.pt": "w"}, {"scraped": scraped})
    graph = Lineage(registry)
    [version] = graph.find("scraped.docs@v1")
    assert [m.digest for m in graph.writers(version)] == [scraped]
    assert [m.digest for m in graph.find("web")] == [bundle]  # an experiment's models: the kind that exports the model
