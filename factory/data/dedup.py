"""Duplicate removal: exact (same sha256) then near (MinHash LSH over word shingles), keeping the first document in id order.

Documents are visited in id order and a near-duplicate is dropped only when it matches a document
already kept, so the result depends on the input, the config and the seed alone. Both run on Daft:
exact dedup as a group-by of the sha256, near dedup in `factory.data.minhash`, with datasketch's
signatures and bands.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from factory.config.data_sections import DedupConfig
from factory.data.minhash import near_duplicates
from factory.data.tables import KEY_COLUMNS, keys_of

TOKEN = re.compile(r"\w+")


@dataclass(frozen=True, kw_only=True, slots=True)
class DedupResult:
    """The documents that survived and how many each step removed."""

    documents: pa.Table
    """Same schema as the input, sorted by id."""
    rows_in: int
    exact_removed: int
    near_removed: int

    @property
    def rows_out(self) -> int:
        """Documents kept."""
        return self.documents.num_rows

    @property
    def removed_share(self) -> float:
        """Share of the input removed as duplicates (0 for an empty input)."""
        return (self.rows_in - self.rows_out) / self.rows_in if self.rows_in else 0.0


def shingles(text: str, size: int) -> set[bytes]:
    """The distinct runs of `size` consecutive word tokens; a shorter text is one shingle of all its tokens (what the
    engine's signatures hash, written out)."""
    tokens = TOKEN.findall(text)
    if len(tokens) <= size:
        return {" ".join(tokens).encode()}
    return {" ".join(tokens[i : i + size]).encode() for i in range(len(tokens) - size + 1)}


def reference_near_duplicates(documents: pa.Table, config: DedupConfig, seed: int) -> set[str]:
    """What `near_duplicates` must remove, computed by datasketch one document at a time (the loop near dedup ran before
    it ran on Daft): visit in id order, drop a document when the LSH of the kept ones has a candidate for it. For the
    tests and bench/data.py."""
    from datasketch import MinHash, MinHashLSH

    template = MinHash(num_perm=config.num_perm, seed=seed)
    index = MinHashLSH(threshold=config.near_threshold, num_perm=config.num_perm)
    removed = set()
    for document, text in sorted(zip(documents["id"].to_pylist(), documents["text"].to_pylist(), strict=True)):
        sketch = template.copy()
        sketch.update_batch(shingles(text, config.shingle_tokens))
        if index.query(sketch):
            removed.add(document)
        else:
            index.insert(document, sketch, check_duplication=False)
    return removed


def exact_firsts(documents: pa.Table) -> set[str]:
    """The id of the first document in id order of each sha256, grouped by Daft (ids are hex: their order is the same
    everywhere)."""
    import daft

    firsts = daft.from_arrow(documents.select(["id", "sha256"])).groupby("sha256").agg(daft.col("id").min())
    return set(firsts.to_pydict()["id"])


@dataclass(frozen=True, kw_only=True, slots=True)
class Duplicates:
    """What dedup removes from a version, found a record batch at a time."""

    keys: pa.Table
    """`id`, `sha256` and `bytes` of every input row."""
    exact: set[str]
    """Ids of documents whose sha256 a document before them in id order has."""
    near: set[str]
    """Ids of the rest that near-duplicate a document kept before them in id order."""

    @property
    def removed(self) -> set[str]:
        """Ids of every document dedup removes."""
        return self.exact | self.near


def find_duplicates(read: Callable[[tuple[str, ...]], Iterable[pa.RecordBatch]], config: DedupConfig, seed: int,
                    on_part: Callable[[int, int], None] | None = None, scratch: Path | None = None) -> Duplicates:
    """Exact then near duplicates of the rows `read(columns)` yields (a pass over those columns each call): the first pass
    reads ids and hashes only, the second the texts a batch at a time (`on_part` and `scratch`: as `near_duplicates`
    says)."""
    keys = keys_of(read(KEY_COLUMNS))
    exact = set(keys["id"].to_pylist()) - exact_firsts(keys) if config.exact else set()
    left = keys.num_rows - len(exact)
    near: set[str] = set()
    if config.near_threshold is not None and left:
        texts = (batch.filter(pa.array([document not in exact for document in batch["id"].to_pylist()], pa.bool_()))
                 for batch in read(("id", "text")))
        near = near_duplicates(texts, config, seed, on_part, left, scratch=scratch)
    return Duplicates(keys=keys, exact=exact, near=near)


def deduplicate(documents: pa.Table, config: DedupConfig, seed: int, log: logging.Logger,
                on_part: Callable[[int, int], None] | None = None) -> DedupResult:
    """Drop exact then near duplicates, keeping the first document in id order of each group (`on_part`: as
    `near_duplicates` says)."""
    table = documents.sort_by("id")
    found = find_duplicates(lambda columns: table.select(list(columns)).to_batches(), config, seed, on_part)
    removed = found.removed
    kept = table.filter(pa.array([document not in removed for document in table["id"].to_pylist()], pa.bool_()))
    result = DedupResult(documents=kept, rows_in=table.num_rows, exact_removed=len(found.exact), near_removed=len(found.near))
    log_dedup(log, result.rows_in, result.rows_out, result.exact_removed, result.near_removed)
    return result


def log_dedup(log: logging.Logger, rows_in: int, rows_out: int, exact: int, near: int) -> None:
    """The one line dedup logs."""
    share = (rows_in - rows_out) / rows_in if rows_in else 0.0
    log.info("dedup: %d -> %d documents (%d exact, %d near duplicates, %.1f%% removed)", rows_in, rows_out, exact, near, 100 * share)
