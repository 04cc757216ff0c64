"""Raw ingest: the files of one source, read into the document table, with every skipped file counted by reason.

A file is a document (`text`), or holds records (`jsonl` lines, `parquet` rows, rows of `arrow` IPC files such as a
Hugging Face `datasets` dataset's shards), each a document whose text is in a
field or rendered from the columns the source keeps. A bad file (binary, not UTF-8, unreadable, too large) or record
(not JSON, a kept column missing or of another type) is skipped and counted, never fatal: a source tree of thousands of
files always holds a few. Which files a source reads is `factory.config.sources`'s
to say: the raw stage's fingerprint holds their digest.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import mmap
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from factory.config.data_sections import SourceConfig
from factory.config.sources import matching_files, source_root
from factory.data.documents import doc_id, document_schemas
from factory.data.tables import BATCH_ROWS, KEY_COLUMNS, Rows

SKIP_REASONS = ("too_large", "binary", "not_utf8", "unreadable", "bad_json", "bad_parquet", "bad_arrow", "empty", "missing_column",
                "wrong_type")
BINARY_SNIFF_BYTES = 8192
ARROW_FILE_MAGIC = b"ARROW1"
Record = tuple[str, dict[str, Any] | None]
"""Where a record is in its file (`path:line`, `path:row`) and the record (None: a line that is not a JSON object)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class IngestResult:
    """The documents of one source and what was left out."""

    documents: Rows
    """The documents (the document schema, then the columns the source keeps), in id order, a batch at a time."""
    files_read: int
    """Files read and decoded (a file of records counts once, however many documents it holds)."""
    skipped: dict[str, int]
    """Reason -> files skipped (for `bad_json`, `missing_column`, `wrong_type` and a record's `empty`: records skipped);
    every reason is present."""


def read_bytes(path: Path, max_file_bytes: int) -> tuple[bytes | None, str | None]:
    """(bytes, None) for a readable regular file within the size bound, else (None, the skip reason)."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):  # a fifo or socket would block or fail on read
            return None, "unreadable"
        if info.st_size > max_file_bytes:
            return None, "too_large"
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)  # replaced by a FIFO since the stat: no hang
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None, "unreadable"
            raw = f.read(max_file_bytes + 1)
    except OSError:
        return None, "unreadable"
    if len(raw) > max_file_bytes:  # grew since stat
        return None, "too_large"
    if not raw:
        return None, "empty"
    return raw, None


def read_text(path: Path, max_file_bytes: int) -> tuple[str | None, str | None]:
    """(text, None) for a readable UTF-8 text file, else (None, the skip reason)."""
    raw, reason = read_bytes(path, max_file_bytes)
    if raw is None:
        return None, reason
    if b"\0" in raw[:BINARY_SNIFF_BYTES]:
        return None, "binary"
    try:
        return raw.decode("utf-8-sig"), None  # a byte-order mark is encoding, not content
    except UnicodeDecodeError:
        return None, "not_utf8"


def jsonl_records(rel: str, text: str) -> list[Record]:
    """(`rel:line`, the record or None when the line is not a JSON object) per non-blank line (lines counted from 1)."""
    records: list[Record] = []
    for number, line in enumerate(text.split("\n"), start=1):  # not splitlines: JSON strings may hold U+2028
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        records.append((f"{rel}:{number}", record if isinstance(record, dict) else None))
    return records


def table_records(rel: str, raw: bytes, form: str) -> list[Record] | None:
    """(`rel:row`, the row as a record) per row of a Parquet or Arrow IPC file (rows counted from 0); None when it is not
    one. Arrow's stream format is what `datasets` writes; its file format (with a footer) is read too."""
    try:
        if form == "parquet":
            rows = pq.read_table(pa.BufferReader(raw)).to_pylist()
        elif raw.startswith(ARROW_FILE_MAGIC):
            rows = pa.ipc.open_file(pa.BufferReader(raw)).read_all().to_pylist()
        else:
            rows = pa.ipc.open_stream(pa.BufferReader(raw)).read_all().to_pylist()
    except (pa.ArrowException, OSError, ValueError):
        return None
    return [(f"{rel}:{number}", row) for number, row in enumerate(rows)]


def turns_of(value: Any) -> list[dict[str, str]] | None:
    """A value as chat turns: a non-empty list of `{role, content}` records of text (other keys left out); None otherwise."""
    if not isinstance(value, list) or not value:
        return None
    if not all(isinstance(t, dict) and isinstance(t.get("role"), str) and isinstance(t.get("content"), str) for t in value):
        return None
    return [{"role": t["role"], "content": t["content"]} for t in value]


def record_document(record: dict[str, Any], config: SourceConfig, kinds: dict[str, bool]) -> tuple[str, str, dict[str, str]] | str:
    """(text, metadata JSON, kept column values) of one record, or why it is skipped.

    A kept value is text, or turns stored as their JSON; the first record that holds a column fixes which (`kinds`:
    column -> turns), so a column never mixes the two. The text is the kept values joined in order (turns: contents
    joined by newlines); without kept columns it is `text_field`'s value.
    """
    wanted = config.columns or (config.text_field,)
    if any(name not in record for name in wanted):
        return "missing_column"
    # text as it is; turns (normalised) only in a kept column; anything else is None
    values = {name: value if isinstance(value := record[name], str) else turns_of(value) if config.columns else None for name in wanted}
    if not all(value is not None and kinds.get(name, isinstance(value, list)) == isinstance(value, list) for name, value in values.items()):
        return "wrong_type"
    kinds.update({name: isinstance(value, list) for name, value in values.items()})
    text = "".join("\n".join(t["content"] for t in value) if isinstance(value, list) else value for value in values.values())
    kept = {name: json.dumps(value, ensure_ascii=False) if isinstance(value, list) else value for name, value in values.items()}
    metadata = {key: value for key, value in record.items() if key not in wanted}
    return text, json.dumps(metadata, sort_keys=True, default=str), kept if config.columns else {}


def file_records(root: Path, rel: str, config: SourceConfig) -> tuple[list[Record] | None, str | None]:
    """The records of one jsonl, Parquet or Arrow file, or (None, why the file is skipped)."""
    if config.format in ("parquet", "arrow"):
        raw, reason = read_bytes(root / rel, config.max_file_bytes)
        if raw is None:
            return None, reason
        records = table_records(rel, raw, config.format)
        return (records, None) if records is not None else (None, f"bad_{config.format}")
    text, reason = read_text(root / rel, config.max_file_bytes)
    return (jsonl_records(rel, text), None) if text is not None else (None, reason)


SPILL_BATCH_BYTES = 64 << 20
"""Text a batch of the spill, and of a pass over it, holds at most (fewer rows than `BATCH_ROWS` when documents are large)."""


@contextlib.contextmanager
def read_documents(name: str, config: SourceConfig, log: logging.Logger, on_part: Callable[[int, int], None] | None = None,
                   scratch: Path | None = None) -> Iterator[IngestResult]:
    """Read every matching file of a source into document rows (source column = name), counting what was skipped
    (`on_part(files done, files)` hears of each file as it is done), in id order, never holding the source whole.

    The documents are written, a batch at a time, to a spill file (Arrow IPC in a temporary directory under `scratch`,
    gone when the `with` ends) while their keys (id, sha256, bytes) are kept. Files that are documents are read in id
    order, so a pass over the rows reads the spill back a batch at a time; records (whose ids are known once read) are
    merged in id order from the spill's sorted batches, memory-mapped, a batch of that order at a time."""
    root = source_root(config)
    skipped = dict.fromkeys(SKIP_REASONS, 0)
    files = matching_files(root, config)
    if config.format == "text":  # a file is a document, its id known from its name: read in id order, spilled in it
        files = sorted(files, key=lambda rel: doc_id(name, rel))
    with tempfile.TemporaryDirectory(prefix=f"ingest-{name[:40]}-", dir=scratch) as spill_dir:
        with contextlib.closing(_Spill(Path(spill_dir) / "documents.arrow", name, document_schemas(config.columns)[0])) as spill:
            files_read = _read_into(spill, config, root, files, skipped, on_part)
        rows = spill.rows()
        size = int(pc.sum(rows.keys["bytes"]).as_py() or 0)
        dropped = ", ".join(f"{reason} {count}" for reason, count in skipped.items() if count) or "none"
        log.info("%s: %d documents (%d bytes) from %d files under %s; skipped: %s", name, rows.keys.num_rows, size, files_read, root, dropped)
        yield IngestResult(documents=rows, files_read=files_read, skipped=skipped)


def _read_into(spill: _Spill, config: SourceConfig, root: Path, files: list[str], skipped: dict[str, int],
               on_part: Callable[[int, int], None] | None) -> int:
    """Every document of `files` into the spill, what is left out counted in `skipped`; the files read."""
    kinds: dict[str, bool] = {}
    files_read = 0
    for done, rel in enumerate(files):
        if on_part is not None and done:  # the file before this one is done (the last: after the loop)
            on_part(done, len(files))
        if config.format == "text":
            text, reason = read_text(root / rel, config.max_file_bytes)
            records: list[Record] | None = [(rel, {config.text_field: text})] if text is not None else None
        else:
            records, reason = file_records(root, rel, config)
        if records is None:
            skipped[str(reason)] += 1
            continue
        files_read += 1
        for where, record in records:
            document = record_document(record, config, kinds) if record is not None else "bad_json"
            if isinstance(document, str):
                # a jsonl line without its text is counted as bad JSON, as it always was
                skipped["bad_json" if config.format == "jsonl" and not config.columns else document] += 1
            elif not document[0]:
                skipped["empty"] += 1
            else:
                spill.add(where, *document)
    if on_part is not None:
        on_part(len(files), len(files))
    return files_read


class _Spill:
    """Documents written to an Arrow IPC file a batch at a time in the order they are read, each batch sorted by id, with
    their keys kept; once closed, the rows in id order (`rows`): each pass reads the file a batch at a time when it was
    written in that order, else merges the sorted batches from the file memory-mapped, a slice of each at a time (the
    pages read given back after each batch)."""

    def __init__(self, path: Path, name: str, schema: pa.Schema) -> None:
        self.path, self.name, self.schema = path, name, schema
        self.writer = pa.ipc.new_file(str(path), schema)
        self.pending: dict[str, list[Any]] = self._empty()
        self.pending_bytes = 0
        self.keys: list[pa.RecordBatch] = []
        self.starts = [0]

    def _empty(self) -> dict[str, list[Any]]:
        return {column: [] for column in self.schema.names}

    def add(self, where: str, text: str, meta: str, values: dict[str, Any]) -> None:
        encoded = text.encode()
        row = self.pending
        row["id"].append(doc_id(self.name, where))
        row["source"].append(self.name)
        row["path"].append(where)
        row["text"].append(text)
        row["bytes"].append(len(encoded))
        # records whose kept values differ are different documents (for dedup and the version's content), also when
        # their texts are equal
        row["sha256"].append(hashlib.sha256(encoded + (json.dumps(list(values.values())).encode() if values else b"")).hexdigest())
        row["metadata"].append(meta)
        for column, value in values.items():
            row[column].append(value)
        self.pending_bytes += len(encoded)
        if len(row["id"]) >= BATCH_ROWS or self.pending_bytes >= SPILL_BATCH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self.pending["id"]:
            return
        batch = pa.record_batch(self.pending, schema=self.schema)
        batch = batch.take(pc.sort_indices(batch, [("id", "ascending")]))  # each part sorted: a pass slices it in order
        self.writer.write_batch(batch)
        self.keys.append(batch.select(list(KEY_COLUMNS)))
        self.starts.append(self.starts[-1] + batch.num_rows)
        self.pending, self.pending_bytes = self._empty(), 0

    def close(self) -> None:
        """Write what is pending and close the file (also when reading failed: the file is closed either way)."""
        try:
            self._flush()
        finally:
            self.writer.close()

    def rows(self) -> Rows:
        """The spilled rows in id order, a fresh pass over the file each call."""
        keys = pa.Table.from_batches(self.keys, schema=pa.schema([self.schema.field(column) for column in KEY_COLUMNS]))
        order = pc.sort_indices(keys, [("id", "ascending")]).to_numpy().astype(np.int64)
        starts, path, schema = np.asarray(self.starts, dtype=np.int64), self.path, self.schema
        cuts = _cuts(keys["bytes"].to_numpy()[order]) if len(order) else []

        def in_order() -> Iterator[pa.RecordBatch]:
            with pa.OSFile(str(path)) as source:  # read, not mapped: one batch in memory at a time
                spilled = pa.ipc.open_file(source)
                for part in range(spilled.num_record_batches):
                    yield spilled.get_batch(part)

        def merged() -> Iterator[pa.RecordBatch]:
            with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                spilled = pa.ipc.open_file(pa.py_buffer(mapped))
                parts = [spilled.get_batch(i) for i in range(spilled.num_record_batches)]
                part_of = np.searchsorted(starts, order, side="right") - 1  # the part of each row, in id order
                taken, gathered = np.zeros(len(parts), np.int64), None
                try:
                    for begin, end in itertools.pairwise([0, *cuts]):
                        # each part is sorted by id, so its rows in this batch are the next ones of it: a slice, no copy
                        counts = np.bincount(part_of[begin:end], minlength=len(parts))
                        gathered = pa.Table.from_batches([parts[p].slice(taken[p], counts[p]) for p in np.nonzero(counts)[0]], schema=schema)
                        taken += counts
                        batches = gathered.take(pc.sort_indices(gathered, [("id", "ascending")])).to_batches()  # copied out of the file
                        gathered = None
                        # the pages read so far leave this process's memory (the file's own, read again if touched): the
                        # merge holds one batch, not the whole spill, whatever the corpus
                        mapped.madvise(mmap.MADV_DONTNEED)
                        yield from batches
                finally:
                    parts = spilled = gathered = None  # the file's views, gone before the map closes

        spilled_in_order = bool(np.all(order[1:] > order[:-1]))
        return Rows(keys=keys.take(pa.array(order)), column_names=tuple(schema.names), batches=in_order if spilled_in_order else merged)


def _cuts(sizes: np.ndarray) -> list[int]:
    """Where batches of rows of these text `sizes` end: each at most `BATCH_ROWS` rows and `SPILL_BATCH_BYTES` of text
    (a row larger than that alone)."""
    total = np.cumsum(sizes)
    cuts, begin = [], 0
    while begin < len(sizes):
        fits = int(np.searchsorted(total, (total[begin - 1] if begin else 0) + SPILL_BATCH_BYTES, side="right"))
        begin = max(begin + 1, min(begin + BATCH_ROWS, fits))
        cuts.append(begin)
    return cuts
