"""Corpus ingest into a real sqlite-backed Iceberg catalog: filtering, splits, snapshots, time travel."""

import logging
from pathlib import Path

import pytest

from factory.config.schema import DataConfig
from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.corpus import SPLITS, ingest, read_split, split_of
from factory.errors import ConfigError

LOG = logging.getLogger("test.corpus")
MAX_FILE_BYTES = 2_000
VALIDATION_PERCENT = 40


def make_source_tree(root: Path) -> dict[str, bytes]:
    """A tiny source tree; returns the files that ingest should keep, by relative path."""
    kept = {f"pkg/mod_{i:02d}.py": f"def f_{i}():\n    return {i} * 'é'\n".encode() for i in range(12)}
    kept["top.py"] = b"import os\nprint(os.sep)\n"
    for rel, data in kept.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "latin1.py").write_bytes("# caf\xe9\n".encode("latin-1"))  # not UTF-8: skipped
    (root / "big.py").write_bytes(b"x = 1\n" * (MAX_FILE_BYTES // 6 + 1))  # over max_file_bytes
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "cached.py").write_bytes(b"ignored = True\n")
    (root / "pkg" / "__init__.py").write_bytes(b"")  # empty: nothing to learn from
    (root / "notes.txt").write_bytes(b"not python\n")
    return kept


@pytest.fixture
def catalog(tmp_path):
    return open_catalog(CatalogConfig.local(tmp_path / "catalog"))


@pytest.fixture
def config():
    return DataConfig(table="raw.test_corpus", validation_percent=VALIDATION_PERCENT, max_file_bytes=MAX_FILE_BYTES)


@pytest.fixture
def source(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    return root, make_source_tree(root)


def test_ingest_keeps_only_decodable_small_python_files(catalog, config, source):
    root, kept = source
    version = ingest(catalog, config, LOG, root=root)
    assert version.skipped == 1
    assert version.table == "raw.test_corpus"
    paths = []
    for split in SPLITS:
        paths += read_split(catalog, config.table, version.snapshot_id, split)["path"].to_pylist()
    assert sorted(paths) == sorted(kept)


def test_rows_and_bytes_per_split_add_up(catalog, config, source):
    root, kept = source
    version = ingest(catalog, config, LOG, root=root)
    expected_rows = {split: 0 for split in SPLITS}
    expected_bytes = {split: 0 for split in SPLITS}
    for rel, data in kept.items():
        split = split_of(rel, VALIDATION_PERCENT)
        expected_rows[split] += 1
        expected_bytes[split] += len(data)
    assert version.rows == expected_rows
    assert version.bytes == expected_bytes
    assert sum(version.rows.values()) == len(kept)
    assert sum(version.bytes.values()) == sum(len(d) for d in kept.values())


def test_split_of_is_deterministic_and_close_to_the_requested_share():
    paths = [f"lib/package_{i // 50}/module_{i}.py" for i in range(2000)]
    first = [split_of(p, 10) for p in paths]
    assert first == [split_of(p, 10) for p in paths]
    share = first.count("validation") / len(paths)
    assert 0.07 <= share <= 0.13
    assert set(first) == {"train", "validation"}
    assert [split_of(p, 50) for p in paths].count("validation") > first.count("validation")


def test_read_split_returns_only_that_split_sorted_by_path(catalog, config, source):
    root, kept = source
    version = ingest(catalog, config, LOG, root=root)
    for split in SPLITS:
        table = read_split(catalog, config.table, version.snapshot_id, split, columns=("path", "text", "split"))
        paths = table["path"].to_pylist()
        assert paths == sorted(paths)
        assert paths == sorted(rel for rel in kept if split_of(rel, VALIDATION_PERCENT) == split)
        assert set(table["split"].to_pylist()) <= {split}
        assert table["text"].to_pylist() == [kept[p].decode() for p in paths]


def test_read_split_rejects_an_unknown_split(catalog, config, source):
    root, _ = source
    version = ingest(catalog, config, LOG, root=root)
    with pytest.raises(ValueError, match="unknown split"):
        read_split(catalog, config.table, version.snapshot_id, "test")


def test_second_ingest_makes_a_new_snapshot_and_the_old_one_stays_readable(catalog, config, source):
    root, kept = source
    old = ingest(catalog, config, LOG, root=root)
    rel = "pkg/mod_03.py"
    split = split_of(rel, VALIDATION_PERCENT)
    (root / rel).write_text("def f_3():\n    return 'changed'\n")
    new = ingest(catalog, config, LOG, root=root)

    assert new.snapshot_id != old.snapshot_id
    assert new.content_sha256 != old.content_sha256
    table = catalog.load_table(config.table)
    assert old.snapshot_id in {s.snapshot_id for s in table.snapshots()}
    assert table.current_snapshot().snapshot_id == new.snapshot_id

    def text_at(snapshot_id: int) -> str:
        table = read_split(catalog, config.table, snapshot_id, split)
        return dict(zip(table["path"].to_pylist(), table["text"].to_pylist(), strict=True))[rel]

    assert text_at(old.snapshot_id) == kept[rel].decode()
    assert text_at(new.snapshot_id) == "def f_3():\n    return 'changed'\n"
    old_rows = read_split(catalog, config.table, old.snapshot_id, split).num_rows
    assert old_rows == read_split(catalog, config.table, new.snapshot_id, split).num_rows  # overwrite, not append


def test_unchanged_sources_give_the_same_content_hash(catalog, config, source):
    root, _ = source
    first = ingest(catalog, config, LOG, root=root)
    second = ingest(catalog, config, LOG, root=root)
    assert first.content_sha256 == second.content_sha256
    assert first.rows == second.rows


def test_empty_directory_is_a_config_error(catalog, config, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="no .py files"):
        ingest(catalog, config, LOG, root=empty)


def test_missing_directory_is_a_config_error(catalog, config, tmp_path):
    with pytest.raises(ConfigError, match="not a directory"):
        ingest(catalog, config, LOG, root=tmp_path / "absent")


def test_identical_content_reuses_its_tagged_snapshot_and_a_lost_tag_is_a_clear_error(tmp_path):
    """Re-ingesting the same bytes writes nothing new; readers resolve the content tag."""
    import logging

    from factory.config.schema import DataConfig
    from factory.data.catalog import CatalogConfig, open_catalog
    from factory.data.corpus import ingest, resolve_tag
    from factory.errors import ArtifactError

    source = tmp_path / "src"
    source.mkdir()
    (source / "a.py").write_text("a = 1\n")
    catalog = open_catalog(CatalogConfig.local(tmp_path / "iceberg"))
    config = DataConfig(table="raw.tagged")
    first = ingest(catalog, config, logging.getLogger("t"), root=source)
    again = ingest(catalog, config, logging.getLogger("t"), root=source)
    assert (again.snapshot_id, again.tag) == (first.snapshot_id, first.tag)
    assert len(catalog.load_table("raw.tagged").snapshots()) == 1
    assert resolve_tag(catalog, "raw.tagged", first.tag) == first.snapshot_id
    with pytest.raises(ArtifactError, match="no snapshot tagged"):
        resolve_tag(catalog, "raw.tagged", "content-0000")
    with pytest.raises(ArtifactError, match="gone from the catalog"):
        resolve_tag(catalog, "raw.missing", first.tag)
