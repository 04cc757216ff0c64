"""Duplicate removal: exact (same sha256) then near (MinHash LSH over word shingles), keeping the first document in id order.

Documents are visited in id order and a near-duplicate is dropped only when it matches a document
already kept, so the result depends on the input, the config and the seed alone.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import pyarrow as pa
from datasketch import MinHash, MinHashLSH

from factory.config.data_sections import DedupConfig

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
    """The distinct runs of `size` consecutive word tokens; a shorter text is one shingle of all its tokens."""
    tokens = TOKEN.findall(text)
    if len(tokens) <= size:
        return {" ".join(tokens).encode()}
    return {" ".join(tokens[i : i + size]).encode() for i in range(len(tokens) - size + 1)}


def first_of_each_digest(digests: list[str]) -> list[bool]:
    """Mask keeping the first row of each digest."""
    seen: set[str] = set()
    keep = []
    for digest in digests:
        keep.append(digest not in seen)
        seen.add(digest)
    return keep


def near_unique(texts: list[str], config: DedupConfig, seed: int) -> list[bool]:
    """Mask keeping each text unless it is a near-duplicate of a text kept before it."""
    assert config.near_threshold is not None, "near dedup needs a threshold"
    template = MinHash(num_perm=config.num_perm, seed=seed)  # permutations are drawn once, then shared by copies
    index = MinHashLSH(threshold=config.near_threshold, num_perm=config.num_perm)
    keep = []
    for row, text in enumerate(texts):
        sketch = template.copy()
        sketch.update_batch(shingles(text, config.shingle_tokens))
        duplicate = bool(index.query(sketch))
        if not duplicate:
            index.insert(row, sketch, check_duplication=False)
        keep.append(not duplicate)
    return keep


def deduplicate(documents: pa.Table, config: DedupConfig, seed: int, log: logging.Logger) -> DedupResult:
    """Drop exact then near duplicates, keeping the first document in id order of each group."""
    table = documents.sort_by("id")
    rows_in = table.num_rows
    if config.exact:
        table = table.filter(pa.array(first_of_each_digest(table["sha256"].to_pylist()), pa.bool_()))
    exact_removed = rows_in - table.num_rows
    if config.near_threshold is not None and table.num_rows:
        table = table.filter(pa.array(near_unique(table["text"].to_pylist(), config, seed), pa.bool_()))
    near_removed = rows_in - exact_removed - table.num_rows
    result = DedupResult(documents=table, rows_in=rows_in, exact_removed=exact_removed, near_removed=near_removed)
    log.info(
        "dedup: %d -> %d documents (%d exact, %d near duplicates, %.1f%% removed)",
        rows_in, result.rows_out, exact_removed, near_removed, 100 * result.removed_share,
    )
    return result
