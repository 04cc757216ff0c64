"""Near-duplicate detection on Daft: the shingles, their hashes and the LSH band collisions computed by the engine, on
every core (Daft's native runner, or a Ray cluster's); the MinHash signatures made from the hashes, and which of the
documents that collide go (in id order), in this process.

The signatures are datasketch's (`MinHash(num_perm, seed)`, its affine32 scheme), value for value, and the bands are
those `MinHashLSH(threshold, num_perm)` picks, so the documents removed are the ones the per-document loop removed:
- a document's shingles are its runs of `shingle_tokens` consecutive `\\w+` tokens joined by one space (a shorter
  document is one shingle of all its tokens). Daft's regular expressions extract them without overlap, so the runs are
  taken in `shingle_tokens` passes, each starting one token later;
- each shingle's hash is the low 32 bits of its sha1 (datasketch's `sha1_hash32`), mixed with MurmurHash3's 32-bit
  finalizer; per permutation `(a, b)` the signature is the minimum of `(a * h + b) mod 2^32` over the shingles, in
  uint32, whose products wrap modulo 2^32 as datasketch's do. The engine extracts and hashes the shingles; the mixing,
  the permutations and the minimum are one compiled loop over them (numba: each shingle's 128 values kept in registers,
  never a column of them; on a chunk of 2,048 documents 0.03 s where 128 columns and a group-by took 1.35 s);
- a band is `r` consecutive signature values; documents whose band is equal collide. Grouping by the values
  themselves (not a hash of them) keeps that exact.

A document is removed when it collides with a document kept before it in id order: the sweep over the collision groups
gives the same answer whatever the number of threads or workers and the order their results come in.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numba
import numpy as np
import pyarrow as pa

from factory.config.data_sections import DedupConfig

os.environ.setdefault("DAFT_ANALYTICS_ENABLED", "0")  # Daft reports each import and run over the network unless told not to

FMIX = ((16, 0x85EBCA6B), (13, 0xC2B2AE35))
"""MurmurHash3's 32-bit finalizer: each step xors in the value shifted right, then multiplies (modulo 2^32); a last
xor of the value shifted right by 16 follows."""
MASK = 0xFFFFFFFF
CHUNK_DOCUMENTS = 2048
"""Documents whose signatures are computed at once: what bounds the memory near dedup takes (each document's shingles,
their text and then 8 bytes each, while they are reduced to its signature)."""
SIGNATURE = "Tuple((uint32[:, ::1], boolean[::1]))(int32[:], uint32[:], uint32[:], uint32[:], int64)"
"""`_minimums`'s types, compiled for as the module is imported."""


def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """datasketch's affine32 permutations for `seed`: odd multipliers `a` and offsets `b`, drawn as it draws them."""
    generator = np.random.RandomState(seed)
    a = generator.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    b = generator.randint(0, 1 << 32, num_perm, dtype=np.uint32)
    return a, b


def bands(config: DedupConfig) -> tuple[int, int]:
    """(bands, rows per band) of datasketch's LSH at the configured threshold and number of permutations."""
    from datasketch import MinHashLSH

    assert config.near_threshold is not None, "near dedup needs a threshold"
    index = MinHashLSH(threshold=config.near_threshold, num_perm=config.num_perm)
    return index.b, index.r


def near_duplicates(documents: pa.Table | Iterable[pa.RecordBatch], config: DedupConfig, seed: int,
                    on_part: Callable[[int, int], None] | None = None, total: int | None = None) -> set[Any]:
    """The ids of `documents` (columns `id`, `text`: a table, or record batches of `total` rows in all) that near-duplicate
    a document kept before them in id order. `on_part(documents signed, documents)` hears of each partition's signatures
    as they are made."""
    import daft

    signed = daft.from_arrow(_signed(documents, config, seed, on_part, total))
    count, rows = bands(config)
    groups: list[list[Any]] = []
    for band in range(count):
        keys = [f"p{i}" for i in range(band * rows, (band + 1) * rows)]
        colliding = signed.groupby(*keys).agg(daft.col("id").list_agg().alias("ids"), daft.col("id").count().alias("n"))
        groups += colliding.where(daft.col("n") > 1).select("ids").to_pydict()["ids"]
    return swept(groups)


def signatures(documents: pa.Table, config: DedupConfig, seed: int) -> dict[Any, list[int]]:
    """Each document's MinHash signature, by id (what the bands are cut from)."""
    table = _signed(documents, config, seed).to_pydict()
    return {document: [table[f"p{i}"][row] for i in range(config.num_perm)] for row, document in enumerate(table["id"])}


def _signed(documents: pa.Table | Iterable[pa.RecordBatch], config: DedupConfig, seed: int,
            on_part: Callable[[int, int], None] | None = None, total: int | None = None) -> pa.Table:
    """The signatures of `documents`, computed CHUNK_DOCUMENTS at a time: the shingles of one chunk are in memory at once,
    never the corpus's (a signature is 4 bytes a permutation, a few hundred a document)."""
    if isinstance(documents, pa.Table):
        documents, total = documents.select(["id", "text"]).to_batches(), documents.num_rows
    chunks, done = [], 0
    for piece in _pieces(documents, CHUNK_DOCUMENTS):
        chunks.append(_signatures(piece, config, seed))
        done += piece.num_rows
        if on_part is not None:
            on_part(done, total if total is not None else done)
    return pa.concat_tables(chunks)


def _pieces(batches: Iterable[pa.RecordBatch], size: int) -> Iterator[pa.Table]:
    """The `id` and `text` of `batches` cut again into tables of `size` rows (the last one shorter; one empty table when
    there are no rows)."""
    held: list[pa.Table] = []
    count, given = 0, False
    for batch in batches:
        held.append(pa.Table.from_batches([batch.select(["id", "text"])]))
        count += batch.num_rows
        while count >= size:
            joined = pa.concat_tables(held)
            yield joined.slice(0, size)
            given, held, count = True, [joined.slice(size)], count - size
    if count or not given:
        yield pa.concat_tables(held) if held else pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())})


def _signatures(piece: pa.Table, config: DedupConfig, seed: int) -> pa.Table:
    """Each document's id and its signature, one column `p<i>` per permutation (of the documents with a shingle: one with
    no text has none)."""
    import daft
    import daft.functions as F
    from daft import col

    size = config.shingle_tokens
    frame = daft.from_arrow(pa.table({"doc": pa.array(np.arange(piece.num_rows, dtype=np.int32)), "text": piece["text"]}))
    words = frame.select(col("doc"), F.list_join(F.regexp_extract_all(col("text"), r"\w+"), " ").alias("words"))
    words = words.with_column("tokens", F.regexp_count(col("words"), r"\S+")).collect()  # once, for the passes below
    run = r"\S+" + r" \S+" * (size - 1)
    shingles = words.where(col("tokens") <= size).select(col("doc"), col("words").alias("shingle"))
    for skip in range(size):
        start = col("words") if skip == 0 else F.regexp_replace(col("words"), r"^(?:\S+ ){%d}" % skip, "")
        taken = words.where(col("tokens") > size).select(col("doc"), F.explode(F.regexp_extract_all(start, run)).alias("shingle"))
        shingles = shingles.concat(taken.where(col("shingle").not_null()))
    low = F.bitwise_and(F.hash(col("shingle"), hash_function="sha1"), _u64(MASK)).cast(daft.DataType.uint32())
    hashed = shingles.select(col("doc"), low.alias("h")).to_arrow()  # 8 bytes a shingle come back here: less than its text
    a, b = permutations(config.num_perm, seed)
    # copies: an array Arrow lends without copying is read-only, which the compiled signature does not take
    doc, hashes = (hashed[name].to_numpy().astype(dtype) for name, dtype in (("doc", np.int32), ("h", np.uint32)))
    values, seen = _minimums(doc, hashes, a, b, piece.num_rows)
    kept = np.flatnonzero(seen)
    signed = values[kept]
    return pa.table({"id": piece["id"].take(pa.array(kept)), **{f"p{i}": pa.array(signed[:, i]) for i in range(config.num_perm)}})


def _compiled(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` compiled for SIGNATURE now, its machine code cached on disk (beside this module, or numba's cache
    directory) when there is a place to write it, else kept in this process only (a read-only image)."""
    try:
        return numba.njit(SIGNATURE, cache=True, nogil=True)(function)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        return numba.njit(SIGNATURE, nogil=True)(function)


@_compiled
def _minimums(doc, hashes, a, b, documents):  # noqa: ANN001, ANN202 - numba's types, in SIGNATURE
    """(each document's signature, whether it has a shingle): per permutation the minimum over its shingles' mixed hashes
    of `(a * h + b) mod 2^32`."""
    signatures = np.full((documents, a.shape[0]), MASK, dtype=np.uint32)
    seen = np.zeros(documents, dtype=np.bool_)
    mask = np.uint64(MASK)
    for j in range(doc.shape[0]):
        h = np.uint64(hashes[j])
        for shift, multiplier in FMIX:
            h = ((h ^ (h >> np.uint64(shift))) * np.uint64(multiplier)) & mask
        h = h ^ (h >> np.uint64(16))
        row = signatures[doc[j]]
        seen[doc[j]] = True
        for i in range(a.shape[0]):
            value = (np.uint64(a[i]) * h + np.uint64(b[i])) & mask
            if value < row[i]:
                row[i] = value
    return signatures, seen


def swept(groups: Sequence[Sequence[Any]]) -> set[Any]:
    """The ids removed when documents are visited in id order and each one that shares a group with a kept one goes."""
    member_of: dict[Any, list[int]] = {}
    for index, ids in enumerate(groups):
        for document in ids:
            member_of.setdefault(document, []).append(index)
    kept_in: set[int] = set()
    removed = set()
    for document in sorted(member_of):
        if any(group in kept_in for group in member_of[document]):
            removed.add(document)
        else:
            kept_in.update(member_of[document])
    return removed


def _u64(value: int) -> Any:
    import daft

    return daft.lit(value).cast(daft.DataType.uint64())
