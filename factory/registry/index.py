"""An index of a registry's manifests: one SQLite file on local disk, so that listing the manifests of one kind reads
one file instead of opening and parsing every manifest (on S3: one GET per manifest).

The manifests stay the source of truth: the index only caches what they say, and deleting it loses nothing (the next
reader builds it again). Each reader brings it up to date first, cheaply:
- on local disk, the manifests lie in 256 shards (`ManifestDirectory`: `manifests/<shard>/<fingerprint>.json`), and a
  shard's mtime changes whenever an entry of it is added, removed or replaced (a publish links a manifest in; a repair
  renames one over; a person or a collector removes one). The index records each shard's mtime; a shard whose mtime
  is the one recorded, and whose record is not "racily clean" (taken within `racy_ns` of the change, when a second
  change could share its timestamp), is not listed: a new manifest lists one shard (about 400 files at 100,000), not
  the registry;
- a shard that changed is listed with a version for each manifest (each file's size, mtime, ctime and inode, no file
  opened; in an object store, where the whole store is listed: keys and ETags, one LIST request per thousand), and only
  the manifests that are new or have another version are read; rows of manifests gone are dropped. A manifest written
  over in place changes no entry of its shard, so it is seen at the next listing of that shard (no writer of the
  factory does that: published manifests are immutable, and a repair renames a new file over the old).
Each refresh that changes a row is a new generation: a row records the generation it came in at, and the rows it
dropped are kept, for `KEEP_GENERATIONS`, with the generation they left at, so a reader that computed something from the
manifests at one state asks what changed since (`changes`) and computes again only what that touches (the
leaderboard's entries). A damaged manifest is recorded as such (so it is not read again on every listing, and warned about once), until it is
replaced. An index that is not a readable SQLite file of this shape is removed with a warning and built again. Two
processes bringing it up to date at once take turns (SQLite's write lock): neither loses the other's rows.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import sqlite3
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from factory.collector import collector_paused

log = logging.getLogger(__name__)
INDEX_NAME = "index.sqlite"
SCHEMA_VERSION = 9
RACY_NS = 2_000_000_000
"""A directory mtime recorded less than this before the listing that read it is trusted no further than that listing: a
file system stamps changes with a coarse clock (milliseconds on ext4 and XFS, whole seconds on some, two on FAT), and a
second change within the tick of the first would leave the same mtime."""
FINE_RACY_NS = 50_000_000
"""The same for a file system whose stamps have a fraction of a second (ext4, XFS, btrfs: the kernel's clock tick, a few
milliseconds): a listing 50 ms after the change it saw is trusted."""
BUSY_TIMEOUT_S = 60
KEEP_GENERATIONS = 1000
"""How many generations of dropped rows are kept: `changes` since an older state answers None (compute it all again)."""
HEX = re.compile(r"[0-9a-f]{1,64}")
SCHEMA = """
CREATE TABLE IF NOT EXISTS manifests (name TEXT PRIMARY KEY, version TEXT NOT NULL, kind TEXT, digest TEXT, experiment TEXT,
                                      body TEXT, created TEXT, generation INTEGER NOT NULL, fingerprint TEXT, size INTEGER,
                                      base_model TEXT, training TEXT, inputs TEXT, shard TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS manifests_by_generation ON manifests (generation);
CREATE INDEX IF NOT EXISTS manifests_by_shard ON manifests (shard, name, version);
CREATE TABLE IF NOT EXISTS shards (name TEXT PRIMARY KEY, mtime INTEGER NOT NULL, listed INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS dropped (name TEXT NOT NULL, body TEXT NOT NULL, generation INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS dropped_by_generation ON dropped (generation);
CREATE INDEX IF NOT EXISTS manifests_by_kind ON manifests (kind, name);
CREATE INDEX IF NOT EXISTS manifests_by_created ON manifests (kind, created);
CREATE INDEX IF NOT EXISTS manifests_by_digest ON manifests (digest);
CREATE INDEX IF NOT EXISTS manifests_by_experiment ON manifests (experiment, kind, name);
CREATE INDEX IF NOT EXISTS manifests_rows ON manifests (name, kind, fingerprint, digest, experiment, created, size, base_model, training,
                                                      inputs);
CREATE TABLE IF NOT EXISTS inputs (name TEXT NOT NULL, digest TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS inputs_by_digest ON inputs (digest, name);
CREATE INDEX IF NOT EXISTS inputs_by_name ON inputs (name, digest);
CREATE TABLE IF NOT EXISTS files (name TEXT NOT NULL, sha256 TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS files_by_sha256 ON files (sha256);
CREATE INDEX IF NOT EXISTS files_by_name ON files (name);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
"""A row per readable manifest (with the columns of a `ManifestRow`, its inputs' digests joined by spaces, which
`manifests_rows` covers, and the shard its file is in: '' in an object store, or a registry's file from before shards),
a row per shard (its mtime and when it was last listed), a row per input it
names (what `Where.made_from` and `Where.descends_from` ask: the index on both columns answers a step of descent without
reading the table), a row per file it lists
(`Where.file_sha256`), and the rows of the last `KEEP_GENERATIONS` generations' dropped manifests (`changes`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Where:
    """Which manifests a listing asks for, besides their kind: every condition given holds."""

    digest: str | None = None
    fingerprint: str | None = None
    digest_prefix: str | None = None
    """Hex digits the digest starts with."""
    experiment: str | None = None
    made_from: str | None = None
    """A digest the manifest names among its inputs."""
    file_sha256: str | None = None
    """The sha256 of one of the artifact's files."""
    descends_from: str | None = None
    """A digest the manifest was made from, directly or through others: its inputs, their inputs, ... name it."""

    def sql(self) -> tuple[str, list[str]]:
        """The conditions as SQL over `manifests`, and their parameters."""
        if self.digest_prefix is not None and not HEX.fullmatch(self.digest_prefix):
            raise ValueError(f"{self.digest_prefix!r} is not hex digits")
        found = [("digest = ?", self.digest), ("name = ?", self.fingerprint), ("digest LIKE ?", self.digest_prefix and f"{self.digest_prefix}%"),
                 ("experiment = ?", self.experiment), ("name IN (SELECT name FROM inputs WHERE digest = ?)", self.made_from),
                 ("name IN (SELECT name FROM files WHERE sha256 = ?)", self.file_sha256), (DESCENDANTS, self.descends_from)]
        given = [(clause, value) for clause, value in found if value is not None]
        if odd := [value for _, value in given if not isinstance(value, str)]:  # else SQLite refuses it, which reads as damage
            raise ValueError(f"a listing's condition is not a string: {odd[0]!r:.80}")
        return " AND ".join(clause for clause, _ in given), [value for _, value in given]

    def among(self, manifests: list[Any]) -> list[Any]:
        """Those of `manifests` (anything with their attributes) that meet the conditions: the same answer as `sql`, in
        Python (descent: the artifacts made from the digest among these manifests, then from those, ...)."""
        below = {self.descends_from, *_made_below(self.descends_from, manifests)} if self.descends_from is not None else None
        return [m for m in manifests if self.holds(m) and (below is None or not below.isdisjoint(m.inputs.values()))]

    def holds(self, manifest: Any) -> bool:
        """Whether one manifest meets the conditions other than descent (which the other manifests decide: `among`)."""
        return ((self.digest is None or manifest.digest == self.digest)
                and (self.fingerprint is None or manifest.fingerprint == self.fingerprint)
                and (self.digest_prefix is None or manifest.digest.startswith(self.digest_prefix))
                and (self.experiment is None or manifest.experiment == self.experiment)
                and (self.made_from is None or self.made_from in manifest.inputs.values())
                and (self.file_sha256 is None or any(entry.get("sha256") == self.file_sha256 for entry in manifest.files.values())))


EVERY = Where()
DESCENDANTS = """name IN (WITH RECURSIVE below(digest) AS (
    SELECT ? UNION SELECT manifests.digest FROM below JOIN inputs ON inputs.digest = below.digest
                   JOIN manifests INDEXED BY manifests_rows ON manifests.name = inputs.name)
  SELECT inputs.name FROM below JOIN inputs ON inputs.digest = below.digest)"""
"""`Where.descends_from` in SQL: the digests made from it (UNION: each once, so a cycle in damaged manifests ends), then
every manifest naming one of them (or it) among its inputs: one query, however deep and wide the graph. Each step reads
a manifest's digest from `manifests_rows`, which covers it, not from the table's row beside its body (SQLite's planner
picks the primary key's index and reads each row: a third longer over a registry of 100,000 manifests)."""


def _made_below(digest: str, manifests: list[Any]) -> set[str]:
    """The digests of the artifacts among `manifests` made from `digest`, directly or not."""
    children: dict[str, set[str]] = {}
    for m in manifests:
        for parent in set(m.inputs.values()):
            children.setdefault(parent, set()).add(m.digest)
    found: set[str] = set()
    todo = [digest]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


class ByDigest:
    """A registry's manifests by digest, each asked of it (its index) when first needed and kept; `None` for a digest
    that is not there, or only in a kind of `skip`. Where two fingerprints published the same bytes, the last by
    fingerprint, as a listing into a dict would keep."""

    def __init__(self, registry: Any, skip: tuple[str, ...] = ()) -> None:
        self._registry, self._skip = registry, skip
        self._known: dict[str, Any] = {}

    def remember(self, manifest: Any) -> None:
        """Keep a manifest a listing already read."""
        self._known.setdefault(manifest.digest, manifest)

    def get(self, digest: str, default: Any = None) -> Any:
        if not isinstance(digest, str) or not HEX.fullmatch(digest):
            return default
        if digest not in self._known:
            found = [m for m in self._registry.manifests(where=Where(digest=digest)) if m.kind not in self._skip]
            self._known[digest] = found[-1] if found else None
        return self._known[digest] if self._known[digest] is not None else default

    def __contains__(self, digest: object) -> bool:
        return isinstance(digest, str) and self.get(digest) is not None

    def __getitem__(self, digest: str) -> Any:
        manifest = self.get(digest)
        if manifest is None:
            raise KeyError(digest)
        return manifest


class ManifestRow(NamedTuple):
    """What a walk over every manifest of a registry needs of each (`factory registry gc`), as the index's columns hold
    it: the manifest is not parsed."""

    kind: str
    fingerprint: str
    digest: str
    experiment: str
    created: str
    size: int
    """The bytes of the artifact's files, as the manifest records them."""
    inputs: tuple[str, ...]
    """The digests among its inputs, sorted."""
    base_model: str | None
    """The model its experiment's `from:` started from."""
    training: str | None
    """What an evaluation result scored: the training artifact of its checkpoint (its summary's `training`)."""

    @classmethod
    def of_body(cls, body: dict[str, Any]) -> ManifestRow:
        """The row of a manifest's JSON form."""
        base, training = body.get("base", {}).get("model"), body["summary"].get("training")
        return cls(body["kind"], body["fingerprint"], body["digest"], body["experiment"], body["created"],
                   sum(entry["bytes"] for entry in body["files"].values()), tuple(sorted(set(body["inputs"].values()))),
                   base if isinstance(base, str) else None, training if isinstance(training, str) else None)


ROWS = """SELECT kind, fingerprint, digest, experiment, created, size, inputs, base_model, training FROM manifests
WHERE kind IS NOT NULL ORDER BY name"""
"""`ManifestIndex.rows`: each manifest's columns, read from the index `manifests_rows` alone (not the bodies)."""
UNLIKE_ROWS = """SELECT name FROM manifests WHERE kind IS NOT NULL AND (typeof(kind) != 'text' OR typeof(fingerprint) != 'text'
    OR typeof(digest) != 'text' OR typeof(experiment) != 'text' OR typeof(created) != 'text' OR typeof(size) != 'integer'
    OR typeof(inputs) != 'text' OR typeof(base_model) NOT IN ('text', 'null') OR typeof(training) NOT IN ('text', 'null')) LIMIT 1"""
"""A row whose columns are not a `ManifestRow`'s (a damaged one), if there is one."""


class ManifestIndex:
    """The index, kept in `path`, of the manifests `listing(shards)` names in those shards (None: all), each with its shard
    and version; `read(shard, name)` parses one into its JSON form, or gives None for one it cannot read (the registry's
    own checks, which warn); `stamps()`, where there is one, gives each shard's mtime (module docstring)."""

    def __init__(self, path: Path, listing: Callable[[set[str] | None], dict[str, tuple[str, str]]],
                 read: Callable[[str, str], dict[str, Any] | None], stamps: Callable[[], dict[str, int]] | None = None) -> None:
        self.path, self._listing, self._read, self._stamps = path, listing, read, stamps

    @classmethod
    def of_versions(cls, path: Path, versions: Callable[[], dict[str, str]], read: Callable[[str], dict[str, Any] | None]) -> ManifestIndex:
        """The index of an object store's manifests, listed whole each time (name -> version: an ETag), in no shard."""
        return cls(path, lambda _: {name: ("", version) for name, version in versions().items()}, lambda _, name: read(name))

    @classmethod
    def of_directory(cls, path: Path, directory: ManifestDirectory, read: Callable[[Path], dict[str, Any] | None]) -> ManifestIndex:
        """The index of a local registry's manifest files (`ManifestDirectory`), each shard listed only when it changed."""
        return cls(path, directory.listing, lambda shard, name: read(directory.file(shard, name)), directory.stamps)

    def bodies(self, kind: str | None = None, where: Where = EVERY, newest: int | None = None, refresh: bool = True) -> Iterator[dict[str, Any]]:
        """The JSON form of every intact manifest (of `kind`, meeting `where`), in name order (`newest`: only that many,
        the newest first), after bringing the index up to date (unless not `refresh`: as it holds them now)."""
        conditions, values = where.sql()
        if kind is not None:
            conditions, values = " AND ".join(filter(None, ["kind = ?", conditions])), [kind, *values]
        with self._connected() as db:
            if refresh:
                self._refresh(db)
            query = "SELECT body FROM manifests WHERE kind IS NOT NULL" + (f" AND {conditions}" if conditions else "")
            order = " ORDER BY name" if newest is None else " ORDER BY created DESC, name DESC LIMIT ?"
            rows = db.execute(query + order, values + ([] if newest is None else [newest])).fetchall()
        for (body,) in rows:
            yield json.loads(body)

    def state(self, refresh: bool = True) -> str | None:
        """A token of the manifests the index holds, after bringing it up to date (unless not `refresh`: as it holds them
        now): the same token, the same manifests (a result computed from them, keyed by it, still holds). None where no
        index can be kept."""
        try:
            with self._connected() as db:
                if refresh:
                    self._refresh(db)
                known = dict(db.execute("SELECT key, value FROM meta WHERE key IN ('epoch', 'generation')").fetchall())
        except (sqlite3.DatabaseError, _Damaged) as e:
            log.debug("no state of the index %s (%s)", self.path, e)
            return None
        return f"{known['epoch']:x}-{known['generation']}" if len(known) == 2 else None

    def changes(self, since: str, refresh: bool = True) -> tuple[str, list[dict[str, Any]]] | None:
        """What changed since the state `since` (a token `state` gave), after bringing the index up to date (unless not
        `refresh`: a caller that just asked its `state`): the state now and the JSON form of every manifest that came in or
        was dropped since (a replaced one: both), in no order. None when `since` is another index's, or older than the
        dropped rows kept, or no index can be kept."""
        epoch, _, generation = since.partition("-")
        try:
            with self._connected() as db:
                if refresh:
                    self._refresh(db)
                db.execute("BEGIN")  # one snapshot: the state and the rows it counts
                try:
                    known = dict(db.execute("SELECT key, value FROM meta WHERE key IN ('epoch', 'generation', 'floor')").fetchall())
                    if f"{known['epoch']:x}" != epoch or not re.fullmatch("[0-9]+", generation) or int(generation) < known.get("floor", 0):
                        return None
                    bodies = [body for query in ("SELECT body FROM manifests WHERE generation > ?", "SELECT body FROM dropped WHERE generation > ?")
                              for (body,) in db.execute(query, (int(generation),))]
                finally:
                    db.execute("COMMIT")
            return f"{known['epoch']:x}-{known['generation']}", [_body(json.loads(body)) for body in bodies]
        except (sqlite3.DatabaseError, _Damaged, KeyError, TypeError, ValueError, RecursionError) as e:  # damaged rows: the caller lists
            log.debug("no changes of the index %s (%s)", self.path, e)
            return None

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
        with contextlib.suppress(OSError):  # a directory that cannot be made: sqlite3 says so
            self.path.parent.mkdir(parents=True, exist_ok=True)
        for suffix in ("", "-journal", "-wal", "-shm"):  # a FIFO or a device there would hang SQLite's first read
            with contextlib.suppress(FileNotFoundError):
                mode = os.lstat(f"{self.path}{suffix}").st_mode
                if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    log.warning("the registry's index %s%s is not a regular file: building the index again", self.path, suffix)
                    self.drop()
        try:
            return _connect(self.path)
        except (_Damaged, sqlite3.DatabaseError) as e:
            if isinstance(e, sqlite3.OperationalError):
                raise
            if isinstance(e, _OtherSchema):  # written by another version of the factory: nothing is wrong
                log.info("the registry's index %s was written by another version of the factory (%s): building it again", self.path, e)
            else:
                log.warning("the registry's index %s is damaged (%s): building it again from the manifests", self.path, e)
        self.drop()
        return _connect(self.path)

    def manifests(self, kind: str | None, where: Where, parse: Callable[[dict[str, Any]], Any], every: Callable[[], list[Any]],
                  newest: int | None = None, refresh: bool = True) -> list[Any]:
        """The intact manifests (of `kind`, meeting `where`) parsed by `parse`, in name order (`newest`: only that many, the
        newest first, by `created` then name; not `refresh`: as the index holds them now); an index holding what `parse`
        refuses is built again (with a warning). Where no index can be kept (sqlite3.OperationalError, or one built again
        that still holds what is not a manifest), `every()` lists every manifest, and those asked for are kept."""
        where.sql()  # a condition that cannot be asked is refused before anything is read
        listed = self._read_or_rebuild(lambda again: [parse(body) for body in self.bodies(kind, where, newest, refresh or again)])
        if listed is not None:
            return listed
        found = [m for m in where.among(every()) if kind in (None, m.kind)]
        return found if newest is None else sorted(found, key=lambda m: (m.created, m.fingerprint), reverse=True)[:newest]

    def _read_or_rebuild(self, read: Callable[[bool], list[Any]]) -> list[Any] | None:
        """`read(again)` of the index; one that finds it damaged has it built again (with a warning) and reads once more
        (`again`: it was built again, so bring it up to date; an index of its own that a query names and the file lacks
        is damage too); None where no index can be kept (sqlite3.OperationalError, or one built again that is still
        damaged): the caller reads the manifests themselves."""
        for attempt in (1, 2):
            try:
                return read(attempt == 2)
            except sqlite3.OperationalError as e:  # no index can be kept here, or it is locked
                if not str(e).startswith("no such index"):  # (one of the index's own, which a query names, dropped: damage)
                    log.debug("listing manifests without the index %s (%s)", self.path, e)
                    return None
                damaged: Exception = e
            except (sqlite3.DatabaseError, _Damaged, TypeError, ValueError, RecursionError) as e:  # damaged pages or rows
                damaged = e
            log.warning("the registry's index %s is damaged (%s): %s", self.path, damaged,
                        "building it again" if attempt == 1 else "reading the manifests themselves")
            self.drop()
        return None

    def rows(self, every: Callable[[], list[Any]]) -> list[ManifestRow]:
        """A `ManifestRow` of every intact manifest, in name order, read from the index's columns after bringing it up to
        date (no manifest parsed: a walk over 100,000 of them reads them in a fraction of a second); a damaged index is
        built again (with a warning). Where no index can be kept, the rows of `every()`'s manifests."""
        listed = self._read_or_rebuild(lambda _: self._rows())
        return listed if listed is not None else [ManifestRow.of_body(manifest.to_json()) for manifest in every()]

    def _rows(self) -> list[ManifestRow]:
        """The rows as the index holds them once brought up to date; TypeError for a row of the wrong types."""
        with self._connected() as db, collector_paused():  # three tuples a row, all kept
            self._refresh(db)
            db.execute("BEGIN")  # one snapshot: the check and the rows
            try:
                if unlike := db.execute(UNLIKE_ROWS).fetchone():
                    raise TypeError(f"the row of {unlike[0]!r} is not a manifest's")
                found = db.execute(ROWS).fetchall()
            finally:
                db.execute("COMMIT")
            return [ManifestRow(kind, fingerprint, digest, experiment, created, size, tuple(inputs.split()), base_model, training)
                    for kind, fingerprint, digest, experiment, created, size, inputs, base_model, training in found]

    def drop(self) -> None:
        """Remove the index (the next reader builds it again from the manifests)."""
        for suffix in ("", "-journal", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):  # then sqlite3 says why
                os.unlink(f"{self.path}{suffix}")

    def _changed_shards(self, db: sqlite3.Connection) -> tuple[set[str] | None, dict[str, int]]:
        """The shards to list again (None: every manifest, where there are no shards to stamp) and each shard's stamp now:
        those whose mtime is not the one recorded, or was recorded racily clean, and those gone."""
        if self._stamps is None:
            return None, {}
        stamps = self._stamps()
        known = {name: (mtime, listed) for name, mtime, listed in db.execute("SELECT name, mtime, listed FROM shards")}
        return {shard for shard in stamps.keys() | known.keys()
                if shard not in known or known[shard][0] != stamps.get(shard) or known[shard][1] - known[shard][0] <= racy_ns(known[shard][0])}, stamps

    def _refresh(self, db: sqlite3.Connection) -> None:
        """Bring the rows up to date with the manifests (module docstring). A manifest that cannot be read now (damaged,
        or refused to this process) gets no row, and the next reader lists its shard again, so it is read again."""
        if self._changed_shards(db)[0] == set():
            return
        db.execute("BEGIN IMMEDIATE")  # one refresher at a time; the other reads its rows after it
        try:
            listed = time.time_ns()
            shards, stamps = self._changed_shards(db)  # again, in turn: another refresher may have listed them
            present = self._listing(shards)
            indexed = dict(db.execute("SELECT name, version FROM manifests" + ("" if shards is None else
                                                                               f" WHERE shard IN ({', '.join('?' * len(shards))})"), list(shards or ())))
            versions = {name: f"{shard}/{version}" for name, (shard, version) in present.items()}
            unseen = {name for name, version in versions.items() if indexed.get(name) != version}  # new, or of another version
            # stale: gone from the shards listed, of another version, or moved in from a shard not listed (its row is replaced)
            stale = (indexed.keys() - present.keys()) | (unseen & indexed.keys()) | {
                name for name in unseen - indexed.keys() if shards is not None and db.execute("SELECT 1 FROM manifests WHERE name = ?", (name,)).fetchone()}
            [generation] = db.execute("SELECT value + 1 FROM meta WHERE key = 'generation'").fetchone()
            db.executemany("INSERT INTO dropped SELECT name, body, ? FROM manifests WHERE name = ?", ((generation, name) for name in stale))
            db.executemany("DELETE FROM manifests WHERE name = ?", ((name,) for name in stale))
            db.executemany("DELETE FROM inputs WHERE name = ?", ((name,) for name in stale))
            db.executemany("DELETE FROM files WHERE name = ?", ((name,) for name in stale))
            unread, inserted = set(), 0
            for name in sorted(unseen):
                shard = present[name][0]
                body = self._read(shard, name)
                if body is None:
                    unread.add(shard)
                    continue
                inserted += 1
                row = ManifestRow.of_body(body)
                db.execute("INSERT INTO manifests (name, version, kind, digest, experiment, body, created, generation, fingerprint, size, "
                           "base_model, training, inputs, shard) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           (name, versions[name], row.kind, row.digest, row.experiment, json.dumps(body, sort_keys=True), row.created, generation,
                            row.fingerprint, row.size, row.base_model, row.training, " ".join(row.inputs), shard))
                db.executemany("INSERT INTO files VALUES (?, ?)", ((name, sha) for sha in {f["sha256"] for f in body["files"].values()}))
                db.executemany("INSERT INTO inputs VALUES (?, ?)", ((name, digest) for digest in set(body["inputs"].values())))
            for shard in shards or ():  # a shard with a manifest unread is listed again by the next reader
                if shard in stamps:
                    db.execute("INSERT OR REPLACE INTO shards VALUES (?, ?, ?)", (shard, -1 if shard in unread else stamps[shard], listed))
                else:
                    db.execute("DELETE FROM shards WHERE name = ?", (shard,))
            if stale or inserted:
                db.execute("UPDATE meta SET value = ? WHERE key = 'generation'", (generation,))
            if (stale or inserted) and generation % 100 == 0:  # now and then: the dropped rows of old generations go
                floor = generation - KEEP_GENERATIONS  # changes since a state at or after it still see every drop
                db.execute("DELETE FROM dropped WHERE generation <= ?", (floor,))
                db.execute("INSERT OR REPLACE INTO meta VALUES ('floor', ?)", (floor,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

def _body(body: Any) -> dict[str, Any]:
    """A manifest's JSON form as a row holds it: TypeError when it is not one (a damaged row)."""
    if (not isinstance(body, dict) or not all(isinstance(body.get(key), str) for key in ("kind", "experiment", "fingerprint", "digest"))
            or not isinstance(inputs := body.get("inputs"), dict) or not all(isinstance(value, str) for value in inputs.values())):
        raise TypeError("a row of the index is not a manifest")
    return body


def _connect(path: Path) -> sqlite3.Connection:
    """The index at `path`, its tables made; _Damaged or sqlite3.DatabaseError when the file is no such index."""
    db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    try:
        if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone():  # new: made once, not at every open
            epoch = int.from_bytes(os.urandom(7))  # this index's own: a state read of another index never matches it
            db.executescript(f"BEGIN IMMEDIATE; {SCHEMA} INSERT OR IGNORE INTO meta VALUES ('schema', {SCHEMA_VERSION}); "
                             f"INSERT OR IGNORE INTO meta VALUES ('epoch', {epoch}); INSERT OR IGNORE INTO meta VALUES ('generation', 0); COMMIT;")
        [version] = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() or [None]
        if version != SCHEMA_VERSION:
            raise _OtherSchema(f"it has schema {version}, this factory writes {SCHEMA_VERSION}")
    except BaseException:
        db.close()
        raise
    return db


class _Damaged(Exception):
    """The index file is a database, not one of this factory's indexes."""


class _OtherSchema(_Damaged):
    """The index file is one of another version of the factory's indexes."""


def racy_ns(mtime: int) -> int:
    """How long after a change stamped `mtime` a listing must be taken to be trusted: `RACY_NS` when the stamp is whole
    seconds (a file system that keeps no fraction, or one in a billion stamps of one that does), else `FINE_RACY_NS`."""
    return RACY_NS if mtime % 1_000_000_000 == 0 else FINE_RACY_NS


SHARD = re.compile(r"[0-9a-f]{2}")


def shard_of(name: str) -> str:
    """The shard of a manifest's name: the first two hex digits of its sha256 (256 shards, filled evenly whatever the
    names look like)."""
    return hashlib.sha256(os.fsencode(name)).hexdigest()[:2]  # a listed name of bytes no encoding decodes too


class ManifestDirectory:
    """A local registry's manifest files: `<path>/<shard>/<name>.json` (`shard_of`), and, in a registry written before
    shards, `<path>/<name>.json`, which `stamps` moves into their shards (a link, then the old name removed: a reader
    finds the file at one name or the other, or both) wherever this process may."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def file(self, shard: str, name: str) -> Path:
        return self.path / shard / f"{name}.json" if shard else self.path / f"{name}.json"

    def stamps(self) -> dict[str, int]:
        """Each shard's mtime ('' is the directory itself, whose entries are the shards and any manifest of before);
        nothing when there is no directory."""
        for _ in range(2):  # again after moving manifests of before into their shards
            try:
                found, old = {"": _mtime(self.path)}, []
                with os.scandir(self.path) as entries:
                    for entry in entries:
                        if entry.name.endswith(".json"):
                            old.append(entry.name)
                        elif SHARD.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):  # not a link to one elsewhere
                            with contextlib.suppress(FileNotFoundError):
                                found[entry.name] = entry.stat(follow_symlinks=False).st_mtime_ns
            except (FileNotFoundError, NotADirectoryError):
                return {}
            if not old or not os.access(self.path, os.W_OK):  # a registry this process only reads: read as it is
                break
            if not (moved := into_shards(self.path, old)):
                break
            log.info("moved %d manifests of %s into their shards (a registry written before shards)", moved, self.path)
        return found

    def listing(self, shards: set[str] | None) -> dict[str, tuple[str, str]]:
        """Manifest name -> its shard and version, for the manifests in `shards` (None: all): those a lookup reads. A file
        in another shard than its name's is not one (`files` has it, for the registry's checks), nor a file of before
        whose name is in its shard too."""
        found: dict[str, tuple[str, str]] = {}
        for shard in self.stamps() if shards is None else shards:
            for name, version in _directory_listing(self.path / shard if shard else self.path).items():
                if shard == shard_of(name) or not shard and not os.path.lexists(self.file(shard_of(name), name)):
                    found[name] = (shard, version)
        return found

    def files(self) -> list[Path]:
        """Every manifest file, wherever it lies, in name order."""
        return sorted((self.file(shard, name) for shard in self.stamps() for name in _directory_listing(self.path / shard if shard else self.path)),
                      key=lambda path: (path.name, str(path)))


def into_shards(directory: Path, entries: list[str]) -> int:
    """Move manifest files of before (`<directory>/<name>.json`, `entries`) into their shards, where this process may: a
    hard link of each (never replacing a manifest the shard has: that one stands), then the old name removed. How many
    were moved."""
    moved = 0
    for entry in entries:
        name = entry.removesuffix(".json")
        try:
            (directory / shard_of(name)).mkdir(exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.link(directory / entry, directory / shard_of(name) / entry, follow_symlinks=False)
            os.unlink(directory / entry)
            moved += 1
        except OSError as e:  # a registry this process may not write, a directory named like a manifest: left as it is
            log.debug("manifest %s stays where it is (%s)", directory / entry, e)
    return moved


def _directory_listing(directory: Path) -> dict[str, str]:
    """Manifest name -> its version: size, mtime, ctime and inode (a file written in place, or a new file at a reused
    inode, has another), from the directory's entries (no file opened); nothing when there is no directory to list."""
    found = {}
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    try:  # each name looked up in the open directory, not along the whole path (a sixth less time at 100,000)
        try:
            names = os.listdir(fd)
        except FileNotFoundError:  # removed since it was opened
            return {}
        for name in names:
            if name.endswith(".json"):
                try:
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:  # removed while listed
                    continue
                found[name[:-5]] = f"{info.st_size}-{info.st_mtime_ns}-{info.st_ctime_ns}-{info.st_ino}"
    finally:
        os.close(fd)
    return found


def _mtime(directory: Path) -> int:
    try:
        return os.stat(directory).st_mtime_ns
    except (FileNotFoundError, NotADirectoryError):
        return 0
