"""Raw ingest: the files of one source, read into the document table, with every skipped file counted by reason.

A bad file (binary, not UTF-8, unreadable, too large) is skipped and counted, never fatal: a source
tree of thousands of files always holds a few. Which files a source reads is `factory.config.sources`'s
to say: the raw stage's fingerprint holds their digest.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from factory.config.schema import SourceConfig
from factory.config.sources import matching_files, source_root
from factory.data.documents import ARROW_SCHEMA, doc_id

SKIP_REASONS = ("too_large", "binary", "not_utf8", "unreadable", "bad_json", "empty")
BINARY_SNIFF_BYTES = 8192


@dataclass(frozen=True, kw_only=True, slots=True)
class IngestResult:
    """The documents of one source and what was left out."""

    documents: pa.Table
    """Document table (ARROW_SCHEMA), sorted by id."""
    files_read: int
    """Files read and decoded (a jsonl file counts once, however many documents it holds)."""
    skipped: dict[str, int]
    """Reason -> files skipped (for `bad_json` and jsonl `empty`: lines skipped); every reason is present."""


def read_text(path: Path, max_file_bytes: int) -> tuple[str | None, str | None]:
    """(text, None) for a readable UTF-8 text file, else (None, the skip reason)."""
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
    if b"\0" in raw[:BINARY_SNIFF_BYTES]:
        return None, "binary"
    try:
        return raw.decode("utf-8-sig"), None  # a byte-order mark is encoding, not content
    except UnicodeDecodeError:
        return None, "not_utf8"


def jsonl_records(text: str, text_field: str) -> list[tuple[int, str | None, str]]:
    """(1-based line number, text or None when the line is bad JSON, metadata JSON) per non-blank line."""
    records = []
    for number, line in enumerate(text.split("\n"), start=1):  # not splitlines: JSON strings may hold U+2028
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            records.append((number, None, ""))
            continue
        if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
            records.append((number, None, ""))
            continue
        body = record.pop(text_field)
        records.append((number, body, json.dumps(record, sort_keys=True)))
    return records


def read_documents(name: str, config: SourceConfig, log: logging.Logger) -> IngestResult:
    """Read every matching file of a source into the document table (source column = name), counting what was skipped."""
    root = source_root(config)
    skipped = dict.fromkeys(SKIP_REASONS, 0)
    paths: list[str] = []
    texts: list[str] = []
    metadata: list[str] = []
    files_read = 0
    for rel in matching_files(root, config):
        text, reason = read_text(root / rel, config.max_file_bytes)
        if text is None:
            skipped[str(reason)] += 1
            continue
        files_read += 1
        if config.format == "text":
            paths.append(rel)
            texts.append(text)
            metadata.append("{}")
            continue
        for number, body, meta in jsonl_records(text, config.text_field):
            if body is None:
                skipped["bad_json"] += 1
            elif not body:
                skipped["empty"] += 1
            else:
                paths.append(f"{rel}:{number}")
                texts.append(body)
                metadata.append(meta)
    encoded = [t.encode() for t in texts]
    table = pa.table(
        {
            "id": [doc_id(name, p) for p in paths],
            "source": [name] * len(paths),
            "path": paths,
            "text": texts,
            "bytes": [len(b) for b in encoded],
            "sha256": [hashlib.sha256(b).hexdigest() for b in encoded],
            "metadata": metadata,
        },
        schema=ARROW_SCHEMA,
    ).sort_by("id")
    dropped = ", ".join(f"{reason} {count}" for reason, count in skipped.items() if count) or "none"
    size = sum(map(len, encoded))
    log.info("%s: %d documents (%d bytes) from %d files under %s; skipped: %s", name, table.num_rows, size, files_read, root, dropped)
    return IngestResult(documents=table, files_read=files_read, skipped=skipped)
