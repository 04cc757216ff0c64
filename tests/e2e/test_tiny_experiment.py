"""The walking skeleton end to end: tiny-code-lm through Dagster on a persistent sqlite instance."""

import json
import subprocess
from pathlib import Path

import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance

from assets.run import failure_messages, run_experiment
from factory.config import STAGES, config_hash, load
from factory.registry import ArtifactStore
from factory.stages.leaderboard import latest_leaderboard

pytestmark = pytest.mark.e2e
ALL_ASSETS = (*STAGES, "leaderboard")
REPO = Path(__file__).resolve().parents[2]
NO_TELEMETRY = {"telemetry": {"enabled": False}}


def materializations(instance: DagsterInstance, asset: str, partition: str | None) -> list:
    """Every materialization of one asset (partition), newest first."""
    partitions = [partition] if partition else None
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=partitions), limit=100).records
    return [record.asset_materialization for record in records]


def metadata_of(materialization) -> dict:
    return {key: value.value for key, value in materialization.metadata.items()}


def test_trained_model_beats_its_untrained_initialisation(pipeline):
    [latest, *_] = materializations(pipeline["instance"], "evaluation", pipeline["name"])
    metadata = metadata_of(latest)
    assert metadata["summary/bpb"] < 0.8 * metadata["summary/init_bpb"], metadata
    results = json.loads((Path(metadata["artifact"]) / "results.json").read_text())
    assert results["bpb"] == metadata["summary/bpb"]


def test_every_asset_records_commit_config_hash_and_digest(pipeline):
    recipe_hash = config_hash(load(pipeline["source"]))
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    for asset in ALL_ASSETS:
        partition = None if asset == "leaderboard" else pipeline["name"]
        found = materializations(pipeline["instance"], asset, partition)
        assert found, f"{asset} was never materialized"
        for materialization in found:
            metadata = metadata_of(materialization)
            assert metadata["git_commit"].startswith(head or "unknown"), (asset, metadata["git_commit"])
            assert metadata["config_hash"] == (recipe_hash if asset != "leaderboard" else metadata["config_hash"]), asset
            assert metadata["digest"] == materialization.tags["dagster/data_version"], asset
            assert Path(metadata.get("artifact", ArtifactStore(pipeline["root"] / "registry").path(metadata["digest"]))).is_dir()


def test_second_run_reuses_every_artifact(pipeline):
    registry = ArtifactStore(pipeline["root"] / "registry")
    for asset in STAGES:
        second, first = materializations(pipeline["instance"], asset, pipeline["name"])[:2]
        assert metadata_of(first)["cache"] == "miss", asset
        assert metadata_of(second)["cache"] == "hit", asset
        assert metadata_of(second)["digest"] == metadata_of(first)["digest"], asset
        assert registry.lookup(metadata_of(second)["fingerprint"]) is not None, asset
    assert sorted(p.name for p in (pipeline["root"] / "registry" / "objects").iterdir()) == pipeline["objects_after_first"]


def test_lineage_is_recorded_in_manifests(pipeline):
    registry = ArtifactStore(pipeline["root"] / "registry")
    by_kind = {m.kind: m for m in registry.manifests()}
    assert by_kind["tokenizer"].inputs == {"corpus": by_kind["corpus"].digest}
    assert by_kind["checkpoints"].inputs == {"corpus": by_kind["corpus"].digest, "tokenizer": by_kind["tokenizer"].digest}
    assert by_kind["model"].inputs == {"checkpoints": by_kind["checkpoints"].digest, "tokenizer": by_kind["tokenizer"].digest}
    assert by_kind["evaluation"].inputs == {"model": by_kind["model"].digest, "corpus": by_kind["corpus"].digest}


def test_leaderboard_lists_the_experiment(pipeline):
    markdown = latest_leaderboard(ArtifactStore(pipeline["root"] / "registry"))
    assert markdown is not None and f"| 1 | {pipeline['name']} |" in markdown
    [latest, *_] = materializations(pipeline["instance"], "leaderboard", None)
    assert pipeline["name"] in metadata_of(latest)["leaderboard"]


def test_a_failing_stage_reports_its_cause_and_publishes_nothing(tmp_path, tiny_path):
    text = tiny_path.read_text().replace("max_file_bytes: 1000000", "max_file_bytes: 1")
    broken = tmp_path / "experiments" / "no-files.md"
    broken.parent.mkdir()
    broken.write_text(text)
    root = tmp_path / "state"
    (tmp_path / "dagster").mkdir()
    result = run_experiment(broken, root, DagsterInstance.local_temp(str(tmp_path / "dagster"), overrides=NO_TELEMETRY))
    assert not result.success
    [message] = failure_messages(result)
    assert message.startswith("corpus:") and "no .py files" in message and "max_file_bytes=1" in message
    assert list(ArtifactStore(root / "registry").manifests()) == []
