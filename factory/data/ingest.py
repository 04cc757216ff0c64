"""Raw ingest: the files of one source, read into the document table, with every skipped file counted by reason.

A bad file (binary, not UTF-8, unreadable, too large) is skipped and counted, never fatal: a source
tree of thousands of files always holds a few. Glob patterns match the posix path relative to the
source root: `*` stays within one directory, `**/` spans any number of them (none included), so
`**/*.py` matches `top.py` as well as `pkg/sub/mod.py`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from factory.config.schema import SourceConfig
from factory.data.documents import ARROW_SCHEMA, doc_id
from factory.errors import ConfigError

SKIP_REASONS = ("too_large", "binary", "not_utf8", "unreadable", "bad_json", "empty")
BINARY_SNIFF_BYTES = 8192
CACHE_DIRS = frozenset({"__pycache__"})
INSTALLED_PACKAGE_DIRS = frozenset({"site-packages", "dist-packages"})


@dataclass(frozen=True, kw_only=True, slots=True)
class IngestResult:
    """The documents of one source and what was left out."""

    documents: pa.Table
    """Document table (ARROW_SCHEMA), sorted by id."""
    files_read: int
    """Files read and decoded (a jsonl file counts once, however many documents it holds)."""
    skipped: dict[str, int]
    """Reason -> files skipped (for `bad_json` and jsonl `empty`: lines skipped); every reason is present."""


def source_root(config: SourceConfig) -> Path:
    """The directory a source reads from; a ConfigError when it is not a directory."""
    match config.kind:
        case "python-stdlib":
            root = Path(sysconfig.get_paths()["stdlib"])
        case "site-packages":
            root = Path(sysconfig.get_paths()["purelib"])
        case "directory":
            assert config.path is not None, "SourceConfig requires path for kind 'directory'"
            root = Path(config.path)
    if not root.is_dir():
        found = "a file" if root.is_file() else "something that is not a directory" if root.exists() else "nothing"
        where = "source.path" if config.kind == "directory" else f"source.kind {config.kind!r} (no source.path)"
        raise ConfigError(
            f"{where}: expected a directory to read, found {found} at {root.resolve()}; "
            "point source.path at an existing directory (relative paths start at the working directory)"
        )
    return root


def glob_pattern(pattern: str) -> re.Pattern[str]:
    """Compile a glob over relative posix paths: `**/` spans directories (or none), `*` and `?` stay within one."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end]
            body = body.replace("\\", "\\\\")
            body = "^" + body[1:] if body.startswith("!") else "\\" + body if body.startswith("^") else body
            out.append("[" + body + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out), re.DOTALL)


def matching_files(root: Path, config: SourceConfig) -> list[str]:
    """Relative posix paths of the files to read, sorted: included, not excluded, not in caches."""
    include = [glob_pattern(p) for p in config.include]
    exclude = [glob_pattern(p) for p in config.exclude]
    pruned = CACHE_DIRS | (INSTALLED_PACKAGE_DIRS if config.kind == "python-stdlib" else frozenset())
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in pruned]
        base = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if base == "." else base + "/"
        for filename in filenames:
            rel = prefix + filename
            if any(p.fullmatch(rel) for p in include) and not any(p.fullmatch(rel) for p in exclude):
                found.append(rel)
    return sorted(found)


def read_text(path: Path, max_file_bytes: int) -> tuple[str | None, str | None]:
    """(text, None) for a readable UTF-8 text file, else (None, the skip reason)."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):  # a fifo or socket would block or fail on read
            return None, "unreadable"
        if info.st_size > max_file_bytes:
            return None, "too_large"
        raw = path.read_bytes()
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
