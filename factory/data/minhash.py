"""Near-duplicate detection on Daft: the words, the shingles, their hashes, the MinHash signatures and the LSH band
collisions computed by the engine, on every core (Daft's native runner, or a Ray cluster's); which of the documents
that collide go (in id order), in this process.

The signatures are datasketch's (`MinHash(num_perm, seed)`, its affine32 scheme), value for value, and the bands are
those `MinHashLSH(threshold, num_perm)` picks, so the documents removed are the ones the per-document loop removed:
- a document's shingles are its runs of `shingle_tokens` consecutive `\\w+` tokens joined by one space (a shorter
  document is one shingle of all its tokens). The engine makes every run of other characters one space (a regular
  expression, one pass); the rest is a Daft batch function (`_signature_batch`: on a Ray cluster, on its workers, so
  that only the signatures come back), whose compiled code (numba) cuts the runs of words out of that (`_shingles`);
- each shingle's hash is the low 32 bits of its sha1 (datasketch's `sha1_hash32`; the engine's sha1, on the CPU's sha1
  instructions where it has them), mixed with MurmurHash3's 32-bit finalizer; per permutation `(a, b)` the signature is
  the minimum of `(a * h + b) mod 2^32` over the shingles, in uint32, whose products wrap modulo 2^32 as datasketch's
  do. The mixing, the permutations and the minimum are one compiled loop over the hashes (`_minimums`: each shingle's
  128 values kept in registers, never a column of them);
- a band is `r` consecutive signature values; documents whose band is equal collide. Grouping by the values
  themselves (not a hash of them) keeps that exact.

Documents are signed a chunk at a time, as many chunks at once as the engine has room for (a thread each here: the
engine's work and the compiled loops hold no interpreter lock, only the glue between them does). The signatures leave
this process as they are made, SPILL_ROWS at a time (`kept_signatures`: Parquet files on this machine's disk, or the Ray
cluster's object store), and the engine groups each band's values from there, one band at a time (on this machine its
group-by holds that band's values and every document's id, an eighth of the signatures at the default 8 bands of 16;
on a Ray cluster its workers do): only the groups of colliding documents come back. A document is removed when it
collides with a document kept before it in id order: the sweep over the collision groups gives the same answer
whatever the number of threads or workers and the order their results come in.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from factory.config.data_sections import DedupConfig

os.environ.setdefault("DAFT_ANALYTICS_ENABLED", "0")  # Daft reports each import and run over the network unless told not to

FMIX = ((16, 0x85EBCA6B), (13, 0xC2B2AE35))
"""MurmurHash3's 32-bit finalizer: each step xors in the value shifted right, then multiplies (modulo 2^32); a last
xor of the value shifted right by 16 follows."""
MASK = 0xFFFFFFFF
CHUNK_DOCUMENTS = 2048
"""Documents whose signatures are computed together: with the chunks signed at once (`in_flight`), what bounds the
memory near dedup takes (each document's text, then its shingles, their text and 8 bytes each, while they are reduced
to its signature)."""
SPILL_ROWS = 32768
"""Signatures put away together: a file of them, or an object of a Ray cluster's store (16 MB at 128 permutations)."""
WORD_GAP = r"[^\p{L}\p{N}_]+"
"""A run of characters that are not in a word: what Python's `\\w` matches is a letter, a number (any of Unicode's)
or `_` (Rust's `\\W`, the engine's, differs: it counts combining marks and joiners as word characters and numbers
such as `²` as not). Code points Python 3.11's tables leave unassigned and the engine's newer ones assign are the
difference that remains."""
SHINGLES = "Tuple((int32[:], int64[:], uint8[:]))(int64[:], uint8[:], boolean[:], int64)"
MINIMUMS = "Tuple((uint32[:, ::1], boolean[::1]))(int32[:], uint32[:], uint32[:], uint32[:], int64)"
"""`_shingles`' and `_minimums`' types, compiled for as the module is imported."""


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
                    on_part: Callable[[int, int], None] | None = None, total: int | None = None, chunk: int | None = None,
                    at_once: int | None = None, scratch: Path | None = None) -> set[Any]:
    """The ids of `documents` (columns `id`, `text`: a table, or record batches of `total` rows in all) that near-duplicate
    a document kept before them in id order. `on_part(documents signed, documents)` hears of each chunk's signatures as
    they are made; `chunk` and `at_once`: as `signatures` says; `scratch`: as `kept_signatures` says."""
    import daft

    count, rows = bands(config)
    groups: list[list[Any]] = []
    with kept_signatures(scratch) as kept:
        _signed(documents, config, seed, kept.add, on_part, total, chunk, at_once)
        signed = kept.frame()
        for band in range(count):
            keys = [f"p{i}" for i in range(band * rows, (band + 1) * rows)]
            colliding = signed.select("id", *keys).groupby(*keys).agg(daft.col("id").list_agg().alias("ids"), daft.col("id").count().alias("n"))
            groups += colliding.where(daft.col("n") > 1).select("ids").to_pydict()["ids"]
    return swept(groups)


def signatures(documents: pa.Table, config: DedupConfig, seed: int, chunk: int | None = None,
               at_once: int | None = None) -> dict[Any, list[int]]:
    """Each document's MinHash signature, by id (what the bands are cut from): computed `chunk` documents at a time
    (default CHUNK_DOCUMENTS), `at_once` chunks at once (default: as many as the engine has room for)."""
    chunks: list[pa.Table] = []
    _signed(documents, config, seed, chunks.append, chunk=chunk, at_once=at_once)
    table = pa.concat_tables(chunks).to_pydict()
    return {document: [table[f"p{i}"][row] for i in range(config.num_perm)] for row, document in enumerate(table["id"])}


def _signed(documents: pa.Table | Iterable[pa.RecordBatch], config: DedupConfig, seed: int, keep: Callable[[pa.Table], None],
            on_part: Callable[[int, int], None] | None = None, total: int | None = None, chunk: int | None = None,
            at_once: int | None = None) -> None:
    """The signatures of `documents`, computed `chunk` (CHUNK_DOCUMENTS) documents at a time, `at_once` chunks at once
    (default: as many as the engine has room for, `factory.data.engine.in_flight`; a thread each here, whose work is the
    engine's and compiled code, which hold no interpreter lock): the shingles of those chunks are in memory at once,
    never the corpus's. Each chunk's signatures (4 bytes a permutation, a few hundred a document) go to `keep` as they
    are made, in the chunks' order."""
    from factory.data.engine import in_flight

    if isinstance(documents, pa.Table):
        documents, total = documents.select(["id", "text"]).to_batches(), documents.num_rows
    going: deque[tuple[Future, int]] = deque()
    done, room = 0, at_once or in_flight()

    def collect() -> None:
        nonlocal done
        future, rows = going.popleft()
        keep(future.result())
        done += rows
        if on_part is not None:
            on_part(done, total if total is not None else done)

    with ThreadPoolExecutor(max_workers=room, thread_name_prefix="minhash") as pool:
        for piece in _pieces(documents, chunk or CHUNK_DOCUMENTS):
            going.append((pool.submit(_signatures, piece, config, seed), piece.num_rows))
            if len(going) >= room:
                collect()
        while going:
            collect()


class KeptSignatures(Protocol):
    """Where a stage keeps the signatures it made until their bands are grouped: not in its own memory, which would grow
    with the corpus (half a kilobyte a document at 128 permutations)."""

    def add(self, signed: pa.Table) -> None:
        """Keep one chunk's signatures (columns `id`, `p<i>`)."""

    def frame(self) -> Any:
        """Every chunk's signatures kept, as a Daft dataframe that reads them where they are."""


@contextlib.contextmanager
def kept_signatures(scratch: Path | None = None) -> Iterator[KeptSignatures]:
    """Where the signatures go for the engine this process runs on, SPILL_ROWS at a time: objects in a Ray cluster's
    object store (the stage holds references only; the groups are made on the cluster), or Parquet files in a temporary
    directory under `scratch` (a stage's own, beside its staging directory; default: the system's), which each band
    reads its columns from. Removed at the end, whatever happens."""
    from factory.data.engine import on_ray

    if on_ray():
        kept = _InObjectStore()
        try:
            yield kept
        finally:
            kept.references.clear()  # the cluster frees what nothing refers to
        return
    with tempfile.TemporaryDirectory(prefix="signatures-", dir=scratch) as directory:
        yield _InFiles(Path(directory))


class _Spilled:
    """Chunks held until they make SPILL_ROWS signatures, then put away together (`_put`): few enough pieces that a
    band's read of them is not mostly opening files or fetching objects, and a bounded few megabytes held meanwhile."""

    def __init__(self) -> None:
        self.held: list[pa.Table] = []
        self.held_rows = 0
        self.count = 0

    def add(self, signed: pa.Table) -> None:
        self.held.append(signed)
        self.held_rows += signed.num_rows
        if self.held_rows >= SPILL_ROWS:
            self._spill()

    def _spill(self) -> None:
        assert self.held, "near dedup signs at least one chunk, an empty one when there are no documents"
        self._put(pa.concat_tables(self.held))
        self.count, self.held, self.held_rows = self.count + 1, [], 0

    def _put(self, signed: pa.Table) -> None:
        raise NotImplementedError

    def _all_put(self) -> None:
        if self.held or not self.count:
            self._spill()


class _InFiles(_Spilled):
    """Parquet files in `directory`, numbered in the order the chunks came (`00000000.parquet`, ...)."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory

    def _put(self, signed: pa.Table) -> None:
        # random 32-bit values: nothing for a compression or a dictionary to gain, only time to lose
        pq.write_table(signed, self.directory / f"{self.count:08d}.parquet", compression="none", use_dictionary=False)

    def frame(self) -> Any:
        import daft

        self._all_put()
        return daft.read_parquet([str(self.directory / f"{n:08d}.parquet") for n in range(self.count)])


class _InObjectStore(_Spilled):
    """Objects in the Ray cluster's store: each chunk put there as one of Daft's own partitions (`ray.put`; the stage
    keeps the reference alone), made one Daft dataframe of those partitions at the end, as Daft makes one of a Ray
    dataset's blocks but without Ray Data, which cannot run through Ray Client (`ray://`, the deployed profile's address):
    there a Ray dataset fails to read its own schema. Daft's internals, pinned with Daft (`daft.from_arrow` would do it
    in public, but reads each partition back to keep a preview of it: the stage would hold every chunk again)."""

    def __init__(self) -> None:
        super().__init__()
        self.references: list[Any] = []
        self.schema: pa.Schema | None = None

    def _put(self, signed: pa.Table) -> None:
        import ray
        from daft.recordbatch import MicroPartition

        self.schema = signed.schema
        self.references.append(ray.put(MicroPartition.from_arrow(signed)))

    def frame(self) -> Any:
        import daft
        from daft.logical.builder import LogicalPlanBuilder
        from daft.runners import get_or_create_runner
        from daft.runners.ray_runner import RayMaterializedResult, RayPartitionSet

        self._all_put()
        partitions = RayPartitionSet()
        for number, reference in enumerate(self.references):
            partitions.set_partition(number, RayMaterializedResult(reference))
        cached = get_or_create_runner().put_partition_set_into_cache(partitions)
        frame = daft.DataFrame(LogicalPlanBuilder.from_in_memory_scan(
            cached, schema=daft.Schema.from_pyarrow_schema(self.schema), num_partitions=partitions.num_partitions(),
            size_bytes=partitions.size_bytes(), num_rows=len(partitions)))
        frame._result_cache = cached  # the partitions are its result: nothing to compute before the bands
        return frame


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
    """Each document's id and its signature, one column `p<i>` per permutation (of the documents whose text is not null:
    an empty text has the signature of one empty shingle), made by the engine (`_signature_batch`)."""
    import daft
    import daft.functions as F
    from daft import col

    frame = daft.from_arrow(piece.select(["id", "text"]))
    # the \w+ words, one space between two: every run of other characters made one space (one may lead, one trail)
    words = F.regexp_replace(col("text"), WORD_GAP, " ")
    signature = daft.DataType.fixed_size_list(daft.DataType.uint32(), config.num_perm)
    sign = daft.func.batch(return_dtype=signature, use_process=False)(_signature_batch)
    signed = frame.select(col("id"), sign(words, config.shingle_tokens, config.num_perm, seed).alias("signature"))
    signed = signed.where(col("signature").not_null()).to_arrow()  # a signature comes back, 4 bytes a permutation
    values = signed["signature"].combine_chunks().flatten().to_numpy().reshape(-1, config.num_perm)
    ids = signed["id"].cast(piece.schema.field("id").type)  # as the documents have them (the engine's strings are large)
    return pa.table({"id": ids, **{f"p{i}": pa.array(values[:, i]) for i in range(config.num_perm)}})


def _signature_batch(words: Any, size: int, num_perm: int, seed: int) -> pa.Array:
    """The signature of each row of `words` (its `\\w+` words, one space between two), none for a null row. Run
    by the engine on a batch of rows at a time (a Daft batch function: on a Ray cluster, on its workers), whose
    shingles (`_shingles`), their sha1 (the engine's) and their minimums (`_minimums`) never leave it."""
    from daft import col
    from daft.functions import hash as hashed
    from daft.recordbatch import RecordBatch

    joined = words.to_arrow().cast(pa.large_string())
    present = joined.is_valid().to_numpy(zero_copy_only=False)
    joined = pc.fill_null(joined, "")
    _, offsets, data = joined.buffers()
    offsets = np.frombuffer(offsets, dtype=np.int64)[joined.offset : joined.offset + len(joined) + 1]
    data = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
    # copies: what Arrow lends without copying is read-only, which the compiled signatures do not take
    row, starts, text = _shingles(offsets.copy(), data.copy(), present, size)
    shingles = pa.record_batch({"shingle": pa.LargeStringArray.from_buffers(len(row), pa.py_buffer(starts), pa.py_buffer(text))})
    batch = RecordBatch.from_arrow_record_batches([shingles], shingles.schema)
    sha1 = batch.eval_expression_list([hashed(col("shingle"), hash_function="sha1").alias("h")]).to_arrow_record_batch()["h"]
    hashes = (sha1.to_numpy() & np.uint64(MASK)).astype(np.uint32)  # the low 32 bits: datasketch's sha1_hash32
    a, b = permutations(num_perm, seed)
    values, seen = _minimums(row, hashes, a, b, len(joined))
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), num_perm, mask=pa.array(~seen))


def _compiled(signature: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A function compiled for `signature` now, its machine code cached on disk (beside this module, or numba's cache
    directory) when there is a place to write it, else kept in this process only (a read-only image)."""
    def compile_(function: Callable[..., Any]) -> Callable[..., Any]:
        try:
            return numba.njit(signature, cache=True, nogil=True)(function)
        except RuntimeError:  # numba: "cannot cache function ...: no locator available"
            return numba.njit(signature, nogil=True)(function)

    return compile_


@_compiled(SHINGLES)
def _shingles(offsets, data, signed, size):  # noqa: ANN001, ANN202 - numba's types, in SHINGLES
    """(the row of each shingle, the shingles' offsets, their bytes): row `r` holds its words
    separated by one space (and maybe one before and after them all), `data[offsets[r]:offsets[r + 1]]`, and has
    shingles when `signed[r]`: its runs of `size` words (all its words when it has no more than `size`: none makes an
    empty shingle), each written as it is in the row."""
    count, length = 0, 0
    for r in range(signed.shape[0]):
        if signed[r]:
            lo, hi = offsets[r], offsets[r + 1]
            words = 0
            for i in range(lo, hi):
                words += data[i] != 32 and (i == lo or data[i - 1] == 32)
            runs = max(words - size, 0) + 1
            count += runs
            length += (hi - lo) * min(runs, size)  # each byte is in at most `size` runs: a bound
    doc = np.empty(count, dtype=np.int32)
    starts = np.empty(count + 1, dtype=np.int64)
    text = np.empty(length, dtype=np.uint8)
    ring = np.empty(size, dtype=np.int64)  # where the last `size` words of the row start
    shingle, at = 0, 0
    for r in range(signed.shape[0]):
        if not signed[r]:
            continue
        lo, hi = offsets[r], offsets[r + 1]
        words, begun, first, last = 0, -1, lo, lo  # begun: where the word under way starts (-1: none is)
        for i in range(lo, hi + 1):
            if i < hi and data[i] != 32:
                if begun < 0:
                    begun = i
                continue
            if begun < 0:
                continue
            ring[words % size] = begun  # word `words` ends here
            if words == 0:
                first = begun
            last = i
            if words >= size - 1:  # the run of `size` words that ends with it
                start = ring[(words - size + 1) % size]
                text[at : at + i - start] = data[start:i]
                doc[shingle], starts[shingle] = r, at
                at, shingle = at + i - start, shingle + 1
            words, begun = words + 1, -1
        if words < size:  # a row of fewer words is one shingle of all of them
            text[at : at + last - first] = data[first:last]
            doc[shingle], starts[shingle] = r, at
            at, shingle = at + last - first, shingle + 1
    starts[shingle] = at
    return doc[:shingle], starts[: shingle + 1], text[:at]


@_compiled(MINIMUMS)
def _minimums(doc, hashes, a, b, documents):  # noqa: ANN001, ANN202 - numba's types, in MINIMUMS
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
