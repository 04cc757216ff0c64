"""Raw ingest: the files of one source, read into the document table, with every skipped file counted by reason.

A file is a document (`text`), or holds records (`jsonl` lines, `parquet` rows, rows of `arrow` IPC files such as a
Hugging Face `datasets` dataset's shards), each a document whose text is in a
field or rendered from the columns the source keeps. A bad file (binary, not UTF-8, unreadable, too large) or record
(not JSON, a kept column missing or of another type) is skipped and counted, never fatal: a source tree of thousands of
files always holds a few. Which files a source reads is `factory.config.sources`'s
to say: the raw stage's fingerprint holds their digest.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from factory.config.data_sections import SourceConfig
from factory.config.sources import matching_files, source_root
from factory.data.documents import doc_id, document_schemas

SKIP_REASONS = ("too_large", "binary", "not_utf8", "unreadable", "bad_json", "bad_parquet", "bad_arrow", "empty", "missing_column",
                "wrong_type")
BINARY_SNIFF_BYTES = 8192
ARROW_FILE_MAGIC = b"ARROW1"
Record = tuple[str, dict[str, Any] | None]
"""Where a record is in its file (`path:line`, `path:row`) and the record (None: a line that is not a JSON object)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class IngestResult:
    """The documents of one source and what was left out."""

    documents: pa.Table
    """Document table (the document schema, then the columns the source keeps), sorted by id."""
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


def read_documents(name: str, config: SourceConfig, log: logging.Logger, on_part: Callable[[int, int], None] | None = None) -> IngestResult:
    """Read every matching file of a source into the document table (source column = name), counting what was skipped
    (`on_part(files done, files)` hears of each file as it is done)."""
    root = source_root(config)
    skipped = dict.fromkeys(SKIP_REASONS, 0)
    paths: list[str] = []
    texts: list[str] = []
    metadata: list[str] = []
    digests: list[str] = []
    kept: dict[str, list[str]] = {column: [] for column in config.columns}
    kinds: dict[str, bool] = {}
    files_read = 0
    files = matching_files(root, config)
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
                text, meta, values = document
                paths.append(where)
                texts.append(text)
                metadata.append(meta)
                # records whose kept values differ are different documents (for dedup and the version's content), also
                # when their texts are equal
                digests.append(hashlib.sha256(text.encode() + (json.dumps(list(values.values())).encode() if values else b"")).hexdigest())
                for column, value in values.items():
                    kept[column].append(value)
    if on_part is not None:
        on_part(len(files), len(files))
    encoded = [t.encode() for t in texts]
    arrow_schema, _ = document_schemas(config.columns)
    table = pa.table(
        {
            "id": [doc_id(name, p) for p in paths],
            "source": [name] * len(paths),
            "path": paths,
            "text": texts,
            "bytes": [len(b) for b in encoded],
            "sha256": digests,
            "metadata": metadata,
            **kept,
        },
        schema=arrow_schema,
    ).sort_by("id")
    size = sum(map(len, encoded))
    dropped = ", ".join(f"{reason} {count}" for reason, count in skipped.items() if count) or "none"
    log.info("%s: %d documents (%d bytes) from %d files under %s; skipped: %s", name, table.num_rows, size, files_read, root, dropped)
    return IngestResult(documents=table, files_read=files_read, skipped=skipped)
