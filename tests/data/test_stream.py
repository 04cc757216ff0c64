"""Streaming a split from an Iceberg snapshot, and the seeded shuffle buffer."""

import logging

import pytest

from factory.config.schema import DataConfig
from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.corpus import ingest, read_split
from factory.data.stream import shuffled, stream_texts


def test_stream_yields_exactly_the_split_of_that_snapshot(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for i in range(60):
        (source / f"m{i:02d}.py").write_text(f"value = {i}\n")
    catalog = open_catalog(CatalogConfig.local(tmp_path / "iceberg"))
    config = DataConfig(table="raw.stream_test", validation_percent=20)
    first = ingest(catalog, config, logging.getLogger("test"), root=source)
    (source / "m00.py").write_text("value = 'changed'\n")
    ingest(catalog, config, logging.getLogger("test"), root=source)
    for split in ("train", "validation"):
        expected = read_split(catalog, "raw.stream_test", first.snapshot_id, split)["text"].to_pylist()
        assert sorted(stream_texts(catalog, "raw.stream_test", first.snapshot_id, split)) == sorted(expected)
        assert "value = 'changed'\n" not in expected
    with pytest.raises(ValueError):
        next(stream_texts(catalog, "raw.stream_test", first.snapshot_id, "test"))


def test_shuffle_is_a_seeded_permutation():
    items = list(range(500))
    a = list(shuffled(items, seed=1, buffer=64))
    assert sorted(a) == items and a != items
    assert a == list(shuffled(items, seed=1, buffer=64))
    assert a != list(shuffled(items, seed=2, buffer=64))


def test_shuffle_buffer_bounds_how_far_ahead_it_reads():
    consumed = []

    def stream():
        for i in range(10_000):
            consumed.append(i)
            yield i

    first = next(shuffled(stream(), seed=0, buffer=32))
    assert len(consumed) == 32 and first in consumed
