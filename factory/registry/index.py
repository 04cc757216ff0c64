"""An index of a registry's manifests on local disk: one SQLite file beside them, so that listing the manifests of one
kind reads one file instead of opening and parsing every manifest.

The manifests stay the source of truth: the index only caches what they say, and deleting it loses nothing (the next
reader builds it again). Each reader brings it up to date first, cheaply:
- the manifests directory's mtime changes whenever an entry is added, removed or replaced (a publish links a manifest
  in; a repair renames one over; a person or a collector removes one). While it equals the mtime the index recorded,
  and that record is not "racily clean" (taken within `RACY_NS` of the change, when a second change could share its
  timestamp), nothing is read;
- otherwise the directory is listed (names and inode numbers, no file opened) and only the manifests that are new or
  were replaced (another inode) are read; rows of manifests gone are dropped.
A damaged manifest is recorded as such (so it is not read again on every listing, and warned about once), until it is
replaced. An index that is not a readable SQLite file of this shape is removed with a warning and built again. Two
processes bringing it up to date at once take turns (SQLite's write lock): neither loses the other's rows.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
INDEX_NAME = "index.sqlite"
SCHEMA_VERSION = 1
RACY_NS = 2_000_000_000
"""A directory mtime recorded less than this before the listing that read it is trusted no further than that listing."""
BUSY_TIMEOUT_S = 60
SCHEMA = """
CREATE TABLE IF NOT EXISTS manifests (name TEXT PRIMARY KEY, inode INTEGER NOT NULL, kind TEXT, body TEXT);
CREATE INDEX IF NOT EXISTS manifests_by_kind ON manifests (kind, name);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


class ManifestIndex:
    """The index of the manifests in `directory` (`<name>.json` files), kept in `path`. `read(path)` parses one manifest
    file into its JSON form and kind, or raises for a damaged one (the registry's own checks)."""

    def __init__(self, path: Path, directory: Path, read: Callable[[Path], tuple[str, dict[str, Any]]]) -> None:
        self.path, self.directory, self._read = path, directory, read

    def bodies(self, kind: str | None = None) -> Iterator[dict[str, Any]]:
        """The JSON form of every intact manifest (of `kind`), in name order, after bringing the index up to date."""
        with self._connected() as db:
            self._refresh(db)
            query = "SELECT body FROM manifests WHERE kind IS NOT NULL" + (" AND kind = ?" if kind is not None else "")
            rows = db.execute(query + " ORDER BY name", (kind,) if kind is not None else ()).fetchall()
        for (body,) in rows:
            yield json.loads(body)

    @contextlib.contextmanager
    def _connected(self) -> Iterator[sqlite3.Connection]:
        """The index open, its tables made; a file that is not such an index is removed (with a warning) and made anew.
        sqlite3.OperationalError (a directory this process cannot write, a lock held past `BUSY_TIMEOUT_S`) goes to the
        caller, which reads the manifests themselves."""
        db = self._open()
        try:
            yield db
        finally:
            db.close()

    def _open(self) -> sqlite3.Connection:
        try:
            return _connect(self.path)
        except (_Damaged, sqlite3.DatabaseError) as e:
            if isinstance(e, sqlite3.OperationalError):
                raise
            log.warning("the registry's index %s is damaged (%s): building it again from the manifests", self.path, e)
        self.drop()
        return _connect(self.path)

    def drop(self) -> None:
        """Remove the index (the next reader builds it again from the manifests)."""
        for suffix in ("", "-journal", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.path}{suffix}")

    def _refresh(self, db: sqlite3.Connection) -> None:
        """Bring the rows up to date with the directory (module docstring)."""
        changed = _mtime(self.directory)
        known = dict(db.execute("SELECT key, value FROM meta WHERE key IN ('mtime', 'listed')").fetchall())
        if known.get("mtime") == changed and known.get("listed", 0) - changed > RACY_NS:
            return
        db.execute("BEGIN IMMEDIATE")  # one refresher at a time; the other reads its rows after it
        try:
            listed = time.time_ns()
            changed = _mtime(self.directory)
            present = _listing(self.directory)
            indexed = dict(db.execute("SELECT name, inode FROM manifests").fetchall())
            gone = indexed.keys() - present.keys()
            db.executemany("DELETE FROM manifests WHERE name = ?", ((name,) for name in gone))
            for name, inode in present.items():
                if indexed.get(name) != inode:
                    db.execute("INSERT OR REPLACE INTO manifests VALUES (?, ?, ?, ?)", (name, inode, *self._row(name)))
            db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", (("mtime", changed), ("listed", listed)))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _row(self, name: str) -> tuple[str | None, str | None]:
        """The kind and body of one manifest; (None, None) when it is damaged (the reader warned)."""
        try:
            kind, body = self._read(self.directory / f"{name}.json")
        except (OSError, ValueError):
            return None, None
        return kind, json.dumps(body, sort_keys=True)


def _connect(path: Path) -> sqlite3.Connection:
    """The index at `path`, its tables made; _Damaged or sqlite3.DatabaseError when the file is no such index."""
    db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    try:
        if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone():  # new: made once, not at every open
            db.executescript(f"BEGIN IMMEDIATE; {SCHEMA} INSERT OR IGNORE INTO meta VALUES ('schema', {SCHEMA_VERSION}); COMMIT;")
        [version] = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() or [None]
        if version != SCHEMA_VERSION:
            raise _Damaged(f"it has schema {version}, this factory writes {SCHEMA_VERSION}")
    except BaseException:
        db.close()
        raise
    return db


class _Damaged(Exception):
    """The index file is a database, not one of this factory's indexes."""


def _listing(directory: Path) -> dict[str, int]:
    """Manifest name -> inode number, from the directory's entries alone (no file opened); nothing when there is no
    directory to list."""
    try:
        with os.scandir(directory) as entries:
            return {entry.name.removesuffix(".json"): entry.inode() for entry in entries if entry.name.endswith(".json")}
    except (FileNotFoundError, NotADirectoryError):
        return {}


def _mtime(directory: Path) -> int:
    try:
        return os.stat(directory).st_mtime_ns
    except (FileNotFoundError, NotADirectoryError):
        return 0
