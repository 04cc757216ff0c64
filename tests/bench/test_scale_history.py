"""bench/scale_history.py's history (bench/scale.py's fixture): one root made once (a registry, a git repository of
experiment files, a Dagster instance on a real PostgreSQL server), then reused as it is by every later run (what an
interrupted measure left taken out), and made again when its database lost its runs (as when its shape or format
changed: `shape`)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.postgres import database

REPO = Path(__file__).resolve().parents[2]


def bench_module(name: str):
    """bench/NAME.py, imported under NAME (as the bench scripts import each other: their directory is on their path)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


histories = bench_module("scale_history")
scale = bench_module("scale")


def stamps(root: Path) -> dict[str, int]:
    return {str(path): path.stat().st_mtime_ns for path in sorted((root / "registry" / "manifests").glob("*/*.json"))}


def test_a_history_is_made_once_then_reused_as_it_is_with_its_instance_on_postgresql(tmp_path, postgres_server):
    from dagster import DagsterInstance

    from assets.partitions import BENCHMARKS, CHECKPOINTS
    from assets.records import latest_metadata_by_partition
    from factory.registry import ArtifactStore

    root = tmp_path / "90"
    with histories.history(root, 90, postgres_server) as made:
        manifests = stamps(root)
        assert len(manifests) >= 90
        with DagsterInstance.get() as instance:
            assert type(instance.run_storage).__name__ == "PostgresRunStorage"
            assert len(instance.get_dynamic_partitions(CHECKPOINTS)) == made["checkpoints"] == 40
            assert len(instance.get_dynamic_partitions(BENCHMARKS)) == histories.BENCHMARK_PARTITIONS
            assert instance.get_run_by_id(made["run"]) is not None
            checkpoints = set(instance.get_dynamic_partitions(CHECKPOINTS))  # the registry's, and their results are its
            results = {f"{m.summary['benchmark']}|{m.summary['checkpoint']}": m.digest
                       for m in ArtifactStore(root / "registry").manifests("evaluations") if m.summary["checkpoint"] in checkpoints}
            recorded = latest_metadata_by_partition(instance, "evaluations")
            assert results and {key: value["result"] for key, value in recorded.items() if "result" in value} == results
        log = subprocess.run(["git", "log", "--format=%H"], cwd=root / "repo", capture_output=True, text=True, check=True).stdout.split()
        assert log[0] == made["commit"] and len(log) == made["commits"]
        assert len(list((root / "repo" / "experiments").glob("*.md"))) == made["files"]
        assert scale.sensor_tick(root, made, repeat=2) > 0  # commits, then puts the repository back
    assert "DAGSTER_HOME" not in os.environ or os.environ["DAGSTER_HOME"] != str(root / "dagster-postgres")
    # what a measure interrupted midway leaves: one more manifest (`one_more`), a commit of the sensor tick's
    model = json.loads(next((root / "registry" / "manifests").glob("*/model-*.json")).read_text())
    ArtifactStore(root / "registry").manifest_path("model-extra").write_text(json.dumps({**model, "fingerprint": "model-extra"}))
    (root / "repo" / "experiments" / "e00000.md").write_text("---\nextends: base.md\nseed: 7\n---\n")
    histories.git(root / "repo", "commit", "-qam", "a tick's")

    with histories.history(root, 90, postgres_server) as again:
        assert again == made  # not made again: the same record, run and commit
        assert stamps(root) == manifests
        assert subprocess.run(["git", "rev-parse", "HEAD"], cwd=root / "repo", capture_output=True, text=True).stdout.strip() == made["commit"]
        with DagsterInstance.get() as instance:
            assert len(instance.get_dynamic_partitions(CHECKPOINTS)) == made["checkpoints"]

    database(postgres_server, "scale_90", keep=False)  # its database lost (another server, a cluster made again): made again
    with histories.history(root, 90, postgres_server) as remade:
        assert remade["run"] != made["run"] and stamps(root) != manifests  # afresh: files and instance
        with DagsterInstance.get() as instance:
            assert len(instance.get_dynamic_partitions(CHECKPOINTS)) == remade["checkpoints"]  # not twice as many
            assert instance.get_run_by_id(made["run"]) is None
