"""The data stages run for real (raw -> dedup -> filtered) on one catalog: the checks decide whether a version is named."""

import json
from pathlib import Path

import pytest

from factory.data import minhash, tables
from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.tables import read_version, resolve
from factory.errors import ArtifactError
from factory.registry.layout import CHECKS_FILE, DATASETS_FILE
from tests.stages.conftest import run_stages

TWINS = {"a.py": "x = 1\n", "b.py": "x = 1\n", "c.py": "y = 2\n"}  # one exact duplicate in three: over the bound of 0
CLEAN = {"a.py": "x = 1\n", "c.py": "y = 2\n"}


pytestmark = pytest.mark.usefixtures("no_pipes")


def filter_files(tmp_path: Path, tiny_path: Path, files: dict[str, str], label: str, tag: str | None = None) -> Path:
    """Ingest `files` as dataset `code` (no dedup, so duplicates reach the checks), filter it; the filtered artifact."""
    dataset = {"dedup": {"exact": False, "near_threshold": None}, "tag": tag}
    return run_stages(tmp_path, tiny_path, files, label, "filtered_datasets", dataset)["filtered_datasets"]


def outcomes(artifact: Path) -> dict[str, dict]:
    return {outcome["name"]: outcome for outcome in json.loads((artifact / CHECKS_FILE).read_text())}


def written(artifact: Path) -> dict:
    return json.loads((artifact / DATASETS_FILE).read_text())["code"]


def test_a_version_its_checks_refuse_takes_no_number_and_the_next_passing_one_is_v1(tmp_path, tiny_path):
    catalog = open_catalog(CatalogConfig.local(tmp_path / "catalog"))
    refused = filter_files(tmp_path, tiny_path, TWINS, "twins")
    assert written(refused)["tag"].startswith("rejected-")
    check = outcomes(refused)["duplicate_share"]
    assert not check["passed"] and "no version of filtered.code has passed yet" in check["description"]
    with pytest.raises(ArtifactError, match="no version tagged 'v1'"):
        resolve(catalog, "filtered.code", "v1")

    fixed = filter_files(tmp_path, tiny_path, CLEAN, "clean")
    assert written(fixed)["tag"] == "v1"
    assert all(outcome["passed"] for outcome in outcomes(fixed).values())
    v1 = read_version(catalog, "filtered.code", resolve(catalog, "filtered.code", "v1"))
    assert sorted(v1["path"].to_pylist()) == sorted(CLEAN)

    again = filter_files(tmp_path, tiny_path, {**TWINS, "d.py": "z = 3\n"}, "twins-again")
    assert written(again)["tag"].startswith("rejected-")
    assert "the last version that passed is filtered.code@v1" in outcomes(again)["duplicate_share"]["description"]
    assert written(filter_files(tmp_path, tiny_path, {**CLEAN, "d.py": "z = 3\n"}, "clean-again"))["tag"] == "v2"


def test_the_stages_stream_a_batch_at_a_time_and_write_what_one_batch_writes(tmp_path, tiny_path, monkeypatch):
    shared = "".join(f"row_{i} = compute({i}, twice=True)\n" for i in range(40))
    files = {**{f"near{n}.py": shared + f"last = {n}\n" for n in range(3)}, "twin_a.py": "z = 9\n" * 9, "twin_b.py": "z = 9\n" * 9,
             "short.py": "s\n", **{f"other{n}.py": f"def other_{n}():\n    return {n}\n" * (n + 2) for n in range(6)}}
    dataset = {"dedup": {"near_threshold": 0.5, "num_perm": 32}, "filters": {"min_bytes": 8}}
    (tmp_path / "whole").mkdir(), (tmp_path / "parted").mkdir()  # a registry and a catalog each: the second writes, never reuses
    whole = run_stages(tmp_path / "whole", tiny_path, files, "source", "filtered_datasets", dataset)
    monkeypatch.setattr(tables, "BATCH_ROWS", 2)  # every version read two rows at a time, signed three at a time
    monkeypatch.setattr(minhash, "CHUNK_DOCUMENTS", 3)
    parted = run_stages(tmp_path / "parted", tiny_path, files, "source", "filtered_datasets", dataset)
    for kind in ("deduped_datasets", "filtered_datasets"):
        assert json.loads((parted[kind] / DATASETS_FILE).read_text()) == json.loads((whole[kind] / DATASETS_FILE).read_text())
    stats = written(parted["filtered_datasets"])
    assert written(parted["deduped_datasets"])["exact_removed"] == 1 and written(parted["deduped_datasets"])["near_removed"] == 2
    assert stats["removed_min_bytes"] == 1 and stats["rows"] == len(files) - 4
    catalog = open_catalog(CatalogConfig.local(tmp_path / "parted" / "catalog"))
    ids = [row for batch in tables.stream_version(catalog, "filtered.code", resolve(catalog, "filtered.code", stats["content_tag"]), ("id",))
           for row in batch["id"].to_pylist()]
    assert ids == sorted(ids) and len(ids) == stats["rows"]  # written in the order read: id order, as a whole table is


def test_a_refused_version_does_not_take_the_configured_tag(tmp_path, tiny_path):
    catalog = open_catalog(CatalogConfig.local(tmp_path / "catalog"))
    refused = filter_files(tmp_path, tiny_path, TWINS, "twins", tag="release")
    assert written(refused)["tag"].startswith("rejected-")
    with pytest.raises(ArtifactError, match="no version tagged 'release'"):
        resolve(catalog, "filtered.code", "release")
    fixed = filter_files(tmp_path, tiny_path, CLEAN, "clean", tag="release")
    assert written(fixed)["tag"] == "release"
    release = read_version(catalog, "filtered.code", resolve(catalog, "filtered.code", "release"))
    assert sorted(release["path"].to_pylist()) == sorted(CLEAN)
