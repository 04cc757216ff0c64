"""Event-log records already read, kept beside the instance: a backfill's planning reads the newest record of every
checkpoint, and 10,000 of them are about 35 MB of JSON to fetch and parse each time (most of a second at that size).

A record is immutable once written: the cache keeps what `assets.records` read from one (its partition and metadata) by
its storage id, in a SQLite file under the instance's directory named by the run storage's id (a storage made anew gets
a new file: its storage ids count from 1 again). A row is used only where its partition is the one the event log gives
that storage id now. Metadata values of more than SHARED_BYTES (a training spec, the same for every checkpoint of one
training) are kept once, by hash. A read of a few labels keeps those only (the row says which), and such a row answers
only a read of those labels or fewer; a read of every label replaces it with the whole record. The cache is never the
source of truth: a file that cannot be read as one is removed with a warning and filled again from the event log (one
an earlier factory kept in another shape, quietly); where none can be kept (an ephemeral instance, a directory that
cannot be written), every record is read from the event log as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import marshal
import sqlite3
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from dagster import DagsterInstance

log = logging.getLogger(__name__)
SCHEMA_VERSION = 2
"""1: whole records only; 2: a row may keep some labels of its record (`labels`)."""
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS records (id INTEGER PRIMARY KEY, partition TEXT NOT NULL, metadata TEXT NOT NULL, shared TEXT NOT NULL,
                                    labels TEXT);
CREATE TABLE IF NOT EXISTS shared_values (hash TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
SHARED_BYTES = 256
"""A metadata value whose JSON is longer is kept once, by hash, for all the records that hold it."""
CHUNK = 500
"""Rows asked for at once (a query's parameters stay under SQLite's limit)."""
BUSY_TIMEOUT_S = 10
Record = tuple[str, dict[str, Any]]
"""A record as `assets.records` reads one: its partition and its metadata (label -> value)."""


class RecordCache:
    """The records read from one instance's event log, by storage id."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def of(cls, instance: DagsterInstance) -> RecordCache | None:
        """The cache of `instance`'s records (None: an ephemeral instance, or a storage that has no id to name it by)."""
        if instance.is_ephemeral:
            return None
        try:
            identity = instance.run_storage.get_run_storage_id()
        except Exception:  # noqa: BLE001 - a storage without one: records are read from the event log every time
            return None
        return cls(Path(instance.root_directory) / "factory" / f"records-{identity}.sqlite")

    def get(self, latest: Mapping[str, int], labels: Collection[str] | None = None) -> dict[int, Record]:
        """Storage id -> record, for the ids of `latest` (partition -> storage id) kept here with that partition and with
        every label of `labels` it has (None: kept whole)."""
        ids = sorted(latest.values())
        if not ids or not self.path.exists():
            return {}
        try:
            with self._connected() as db:
                rows = [row for start in range(0, len(ids), CHUNK) for row in db.execute(
                    f"SELECT id, partition, metadata, shared, labels FROM records WHERE id IN ({','.join('?' * len(ids[start:start + CHUNK]))})",
                    ids[start:start + CHUNK])]
                hashes = sorted({value for row in rows for value in json.loads(row[3]).values()})
                shared = {hash_: json.loads(text) for start in range(0, len(hashes), CHUNK) for hash_, text in db.execute(
                    f"SELECT hash, value FROM shared_values WHERE hash IN ({','.join('?' * len(hashes[start:start + CHUNK]))})",
                    hashes[start:start + CHUNK])}
            found: dict[int, Record] = {}
            wanted = None if labels is None else set(labels)
            covers: dict[str, bool] = {}  # a row's `labels` -> whether they hold those asked for (the rows of one read share one)
            for storage_id, partition, text, links, kept in rows:
                if latest.get(partition) != storage_id:
                    continue  # another storage's record under this id: read it again
                if kept is not None and kept not in covers:
                    covers[kept] = wanted is not None and wanted <= set(json.loads(kept))
                if kept is not None and not covers[kept]:
                    continue  # some labels of the record only, not those asked for: read it again
                metadata = json.loads(text)
                for label, hash_ in json.loads(links).items():
                    metadata[label] = shared[hash_]
                found[storage_id] = (partition, metadata)
            return found
        except sqlite3.OperationalError:
            return {}  # (locked past the timeout, say: read from the event log this time)
        except (sqlite3.DatabaseError, _Damaged, ValueError, TypeError, KeyError, AttributeError) as e:
            self._drop(e)
            return {}

    def put(self, records: Mapping[int, Record], labels: Collection[str] | None = None) -> None:
        """Keep `records` (storage id -> record: whole, or the entries of `labels` it has); a cache that cannot be written
        is left as it is. A whole record replaces a row of some labels, never the other way round."""
        if not records:
            return
        kept = None if labels is None else json.dumps(sorted(labels))
        rows, values = [], {}
        encoded: dict[bytes, tuple[str, str] | None] = {}  # marshal bytes of a JSON value -> (hash, text), None: small
        for storage_id, (partition, metadata) in records.items():
            small, links = {}, {}
            for label, value in metadata.items():
                shared = None
                if isinstance(value, (dict, list)) or (isinstance(value, str) and len(value) > SHARED_BYTES):
                    # The records of one training hold equal specs: each is encoded once. (Equal marshal bytes are equal
                    # JSON: they tell 1 from 1.0 and True, and 0.0 from -0.0, where == does not.)
                    key = marshal.dumps(value)
                    if key not in encoded:
                        text = json.dumps(value, separators=(",", ":"))
                        encoded[key] = (hashlib.sha256(text.encode()).hexdigest(), text) if len(text) > SHARED_BYTES else None
                    shared = encoded[key]
                if shared is not None:
                    values[shared[0]], links[label], small[label] = shared[1], shared[0], None  # (None: its place among the labels)
                else:
                    small[label] = value
            rows.append((storage_id, partition, json.dumps(small, separators=(",", ":")), json.dumps(links, separators=(",", ":")), kept))
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._connected() as db:
                db.execute("BEGIN IMMEDIATE")
                db.executemany("INSERT OR IGNORE INTO shared_values VALUES (?, ?)", values.items())
                db.executemany("INSERT INTO records VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET partition = excluded.partition, "
                               "metadata = excluded.metadata, shared = excluded.shared, labels = excluded.labels "
                               "WHERE excluded.labels IS NULL OR records.labels IS NOT NULL", rows)
                db.execute("COMMIT")
        except (sqlite3.DatabaseError, _Damaged) as e:
            if not isinstance(e, sqlite3.OperationalError):  # (locked, read-only, no space: left for the next read)
                self._drop(e)
        except OSError:
            pass  # the instance's directory cannot be written: nothing kept

    @contextlib.contextmanager
    def _connected(self) -> Iterator[sqlite3.Connection]:
        db = self._opened()
        try:
            version = self._version(db)
            if isinstance(version, int) and 0 < version < SCHEMA_VERSION:  # an earlier factory's: made anew, quietly
                db.close()
                self.remove()
                db = self._opened()
                version = self._version(db)
            if version != SCHEMA_VERSION:
                raise _Damaged(f"it has schema {version}, this factory keeps {SCHEMA_VERSION}")
            yield db
        finally:
            db.close()

    def _opened(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        db.execute("PRAGMA synchronous=NORMAL")  # no fsync at each commit: a write lost to a crash is read from the log again
        return db

    @staticmethod
    def _version(db: sqlite3.Connection) -> Any:
        """The schema the file is kept in (made now where it is new)."""
        if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone():  # new: made once
            db.execute("PRAGMA journal_mode=WAL")  # readers are not held up by a writer
            db.executescript(f"BEGIN IMMEDIATE; {SCHEMA} INSERT OR IGNORE INTO meta VALUES ('schema', {SCHEMA_VERSION}); COMMIT;")
        [version] = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() or [None]
        return version

    def remove(self) -> None:
        """Remove the file (and SQLite's files beside it): every record is read from the event log again, then kept."""
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(OSError):
                Path(f"{self.path}{suffix}").unlink()

    def _drop(self, error: BaseException) -> None:
        log.warning("the cache of event-log records %s cannot be read (%s): removed, its records are read from the event log "
                    "and kept again", self.path, error)
        self.remove()


class _Damaged(Exception):
    """The file is a database, but not this cache."""
