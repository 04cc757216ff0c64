"""Stream a split of an Iceberg snapshot record batch by record batch, in a seeded shuffled order."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from typing import TypeVar

from pyiceberg.catalog import Catalog
from factory.data.corpus import scan_split

SHUFFLE_BUFFER_DOCS = 1024
T = TypeVar("T")


def stream_texts(catalog: Catalog, table: str, snapshot_id: int, split: str) -> Iterator[str]:
    """Texts of one split of one snapshot, read lazily; memory holds one record batch at a time."""
    for batch in scan_split(catalog, table, snapshot_id, split, ("text",)).to_arrow_batch_reader():
        yield from batch.column("text").to_pylist()


def shuffled(items: Iterable[T], seed: int, buffer: int = SHUFFLE_BUFFER_DOCS) -> Iterator[T]:
    """A seeded shuffle through a bounded buffer: the same input order and seed give the same output."""
    rng = random.Random(seed)
    pool: list[T] = []
    for item in items:
        pool.append(item)
        if len(pool) >= buffer:
            index = rng.randrange(len(pool))
            pool[index], pool[-1] = pool[-1], pool[index]
            yield pool.pop()
    rng.shuffle(pool)
    yield from pool
