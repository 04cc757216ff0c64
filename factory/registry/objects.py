"""The registry in an object store (S3), where there is no rename: the same artifacts, manifests, leases and refs as
`ArtifactStore` keeps on disk, through the storage seam (`factory.storage.ObjectStore`).

Keys in the store:
    objects/<digest>/<name>       each file of an artifact, uploaded with its sha256 recorded as object metadata
    manifests/<fingerprint>.json  written last and only if absent (`If-None-Match: *`): only a manifest makes an
                                  artifact exist, so a publish cut short leaves no artifact, only objects no one names
    verified/<digest>.json        the ETag of each file when its sha256 was last checked (at upload, or by reading)
    digests/<digest>              the fingerprint of the manifest last published for these bytes: a reader that has a
                                  digest (a stage's input) finds its manifest in two GETs, with no listing (a hint only:
                                  when it is missing or stale, the index answers)
    layout.json                   the layout of these keys (`LAYOUT`): a store written by a newer factory is refused
    leases/<fingerprint>.lease    see `factory.registry.object_lease`
    work/<fingerprint>/<name>     a running stage's scratch (checkpoints, logs) as of its last checkpoint: a relaunch on
                                  any machine resumes from it
    refs/<name>                   a named digest
    history/<topic>/<seq>.json    append-only records (promotions, reproductions), each created only if absent

A lookup proves an artifact intact from the store's own metadata, reading no bytes: every file is there with its size,
and with the ETag it had when its sha256 was checked (an object written again gets another ETag, and is read and hashed
again). A damaged or missing object is a miss, which the stage recomputes. Of two processes publishing one fingerprint
at once, one manifest is written and the other process returns it.

Reading an artifact (`open`) copies it into a local directory (`cache/objects/<digest>`), hashing every file on the way:
the copy is put in place only when its files give the digest, so what is served is exactly what was published. A reader
of one part needs no copy of the rest: `read` gets one small file's bytes, `fetch` one file or directory (a checkpoint)
into `cache/parts/<digest>/`, each checked against the manifest's sha256.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from factory.errors import ArtifactError, ConfigError, StorageError, number_setting
from factory.registry import object_lease
from factory.registry.files import DIGEST, NAME, RECORD_BYTES, entries, hash_files, make_read_only, make_writable, sha256_file
from factory.registry.history import RECORD, checked_topic, parse_record
from factory.registry.index import EVERY, ManifestIndex, ManifestRow, Where
from factory.registry.lease import Holder
from factory.registry.store import Manifest, Provenance, Scratch, artifact_digest, parse_manifest
from factory.registry.verify import Damage, damage_of
from factory.storage import ObjectStore

LAYOUT = 1
CACHE_ENV = "FACTORY_STORE_CACHE_GB"
CACHE_GB = 50.0
"""How much the local copies of artifacts read from the store may hold (`$FACTORY_STORE_CACHE_GB`)."""
CACHE_GRACE_S = 600.0
"""A copy used more recently is never removed to make room."""
MANIFEST_WRITES = 5
"""Tries at writing a manifest while other processes write it too (each lost try reads what won)."""
"""The layout of the keys above; a factory refuses a store whose layout is newer than the one it writes."""
log = logging.getLogger(__name__)
_warned: set[str] = set()


class ObjectRegistry(Scratch):
    """Published artifacts in an object store; a local directory (`local`) for staging, scratch work and copies read."""

    def __init__(self, store: ObjectStore, local: str | Path, *, setting: str = "FACTORY_STORE") -> None:
        self.store = store
        self.root = Path(local).resolve()
        self.location = store.uri
        self._hashed: dict[tuple[str, str], tuple[tuple[int, int, int], str]] = {}
        self._check_layout(setting)

    def path(self, digest: str) -> Path:
        """The local copy of an artifact, fetched (as `open` does) when the store has it; where the copy would be when it
        does not (readers of optional files find nothing there)."""
        try:
            return self.open(digest)
        except ArtifactError:
            return self._copy(digest)

    def where(self, digest: str) -> str:
        """Where a published artifact is, to show people and Dagster: its prefix in the store, fetching nothing (`path`
        copies the whole artifact here)."""
        return f"{self.location}/objects/{_check(DIGEST, digest, 'an artifact digest (64 hex digits)')}"

    def _copy(self, digest: str) -> Path:
        _check(DIGEST, digest, "an artifact digest (64 hex digits)")
        return self.root / "cache" / "objects" / digest

    def lookup(self, fingerprint: str, rehash: bool = False) -> Manifest | None:
        """The manifest for a fingerprint if its artifact is published and intact, else None. Files whose ETag is the
        one recorded when their sha256 was checked are not read, unless `rehash`."""
        manifest = self._manifest(fingerprint)
        return manifest if manifest is not None and self._intact(manifest, rehash) else None

    def read(self, manifest: Manifest, name: str) -> bytes | None:
        """The bytes of one file of a published artifact, None when it has no such file: from the local copy when there
        is one, else that object alone (the rest of the artifact is not fetched), checked against the manifest's sha256."""
        entry = manifest.files.get(name)
        if entry is None:
            return None
        copy = self._copy(manifest.digest)
        if copy.is_dir():
            return (copy / name).read_bytes()
        blob = self.store.get(f"objects/{manifest.digest}/{name}", limit=entry["bytes"])
        if blob is None or hashlib.sha256(blob.data).hexdigest() != entry["sha256"]:
            raise ArtifactError(f"artifact {manifest.digest[:12]} in {self.location}: {name} is "
                                f"{'missing' if blob is None else 'damaged'}; rerun its stage to publish it again")
        return blob.data

    def fetch(self, manifest: Manifest, name: str) -> Path:
        """One file or directory of a published artifact on local disk: in its whole local copy when there is one, else
        that part alone, fetched into the cache (`cache/parts/<digest>/`), each file checked against the manifest's
        sha256; where it would be when the artifact has no such part."""
        copy = self._copy(manifest.digest)
        names = manifest.files_under(name)
        if copy.is_dir() or not names:
            return copy / name
        parts = self.root / "cache" / "parts" / manifest.digest
        target = parts / name
        if target.exists():
            with contextlib.suppress(OSError):
                os.utime(parts)  # used now: the last a full cache gives up
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        # beside the parts, not in them: a trim by another process may remove an artifact's parts, never this download
        with tempfile.TemporaryDirectory(prefix=f"{manifest.digest[:12]}-", dir=parts.parent) as scratch:
            for key in names:
                (Path(scratch) / key).parent.mkdir(parents=True, exist_ok=True)
                self.store.download(f"objects/{manifest.digest}/{key}", Path(scratch) / key)
                if sha256_file(Path(scratch) / key) != manifest.files[key]["sha256"]:
                    raise ArtifactError(f"artifact {manifest.digest[:12]} in {self.location}: {key} is damaged; rerun its "
                                        "stage to publish it again")
            _place(Path(scratch) / name, target)
        self._trim_cache(keep=parts)
        return target

    def open(self, digest: str) -> Path:
        """A local directory holding the artifact's files, each checked against its sha256; raise if it is not there."""
        target = self._copy(digest)
        if target.is_dir():
            with contextlib.suppress(OSError):
                os.utime(target)  # used now: the last a full cache gives up
            return target
        names = [key.removeprefix(f"objects/{digest}/") for key in self.store.list(f"objects/{digest}/")]
        if not names:
            raise ArtifactError(f"artifact {digest[:12]} is not in the registry at {self.location}; rerun its stage")
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f"{digest[:12]}-", dir=target.parent) as scratch:
            copy = Path(scratch) / "copy"
            for name in names:
                (copy / name).parent.mkdir(parents=True, exist_ok=True)
                self.store.download(f"objects/{digest}/{name}", copy / name)
            if artifact_digest(hash_files(copy)) != digest:
                raise ArtifactError(f"artifact {digest[:12]} in {self.location} does not hash to its digest (damaged); "
                                    "rerun its stage to publish it again")
            _place(copy, target)
        self._trim_cache(keep=target)
        return target

    def _trim_cache(self, keep: Path) -> None:
        """Remove the least recently used local copies (whole artifacts, and the parts `fetch` got) while they hold more
        than `$FACTORY_STORE_CACHE_GB` (default `CACHE_GB`), never `keep` nor a copy used in the last `CACHE_GRACE_S` (a
        reader may still be opening its files)."""
        bound = number_setting(CACHE_ENV, os.environ.get(CACHE_ENV), default=CACHE_GB, low=0, high=math.inf,
                               says=f"give the local copies' bound in GB, a number such as {CACHE_GB:g} (or unset it)") * (1 << 30)
        copies = []
        for path in [path for held in ("objects", "parts") if (self.root / "cache" / held).is_dir()
                     for path in (self.root / "cache" / held).iterdir()]:
            if path.is_dir() and DIGEST.match(path.name):
                found, _ = entries(path)
                copies.append((path.stat().st_mtime, sum(info.st_size for info in found.values()), path))
        total, now = sum(size for _, size, _ in copies), time.time()
        for used, size, path in sorted(copies):
            if total <= bound:
                break
            if path != keep and now - used > CACHE_GRACE_S:
                make_writable(path)
                shutil.rmtree(path, ignore_errors=True)
                total -= size

    def set_ref(self, name: str, digest: str) -> None:
        """Point the named ref at a published artifact."""
        if not self.store.list(f"objects/{_check(DIGEST, digest, 'an artifact digest')}/"):
            raise ArtifactError(f"artifact {digest[:12]} is not in the registry at {self.location}; rerun its stage")
        self.store.put(f"refs/{_check(NAME, name, 'a ref name')}", digest.encode())

    def ref(self, name: str) -> str | None:
        """The digest a named ref points at, or None."""
        blob = self.store.get(f"refs/{_check(NAME, name, 'a ref name')}", limit=RECORD_BYTES)
        digest = blob.data.decode(errors="replace").strip() if blob is not None else ""
        return digest if DIGEST.match(digest) else None

    def lease(self, fingerprint: str, owner: str, **options: Any) -> contextlib.AbstractContextManager[None]:
        """Hold the lease on computing `fingerprint` (waiting while someone else holds it)."""
        return object_lease.hold(self.store, self._lease_key(fingerprint), owner, **options)

    def holder(self, fingerprint: str) -> Holder | None:
        """Who is computing `fingerprint` right now, if anyone."""
        return object_lease.read_holder(self.store, self._lease_key(fingerprint))

    def holders(self) -> list[Holder]:
        """Whoever holds a lease in the store now (including holders that died: `abandoned` tells)."""
        keys = [key for key in self.store.list("leases/") if key.endswith(".lease")]
        return [holder for key in keys if (holder := object_lease.read_holder(self.store, key)) is not None]

    def remove(self, manifest: Manifest | ManifestRow) -> int | None:
        """Remove a published artifact, as `ArtifactStore.remove` does: the manifest first, then its objects unless another
        manifest names the same bytes (and this machine's copy). The bytes freed (None: the manifest is no longer this one)."""
        current = self._manifest(manifest.fingerprint)
        if current is None or current.digest != manifest.digest:
            return None
        self.store.delete(self._manifest_key(manifest.fingerprint))
        if (other := self._indexed(manifest.digest)) is not None:
            self.store.put(self._digest_key(manifest.digest), other.fingerprint.encode())  # the pointer names one that stays
            return 0
        for key in self.store.list(f"objects/{manifest.digest}/"):
            self.store.delete(key)
        self.store.delete(f"verified/{manifest.digest}.json")
        self.store.delete(self._digest_key(manifest.digest))
        if (copy := self._copy(manifest.digest)).is_dir():
            make_writable(copy)
            shutil.rmtree(copy, ignore_errors=True)
        return manifest.size

    def history(self, topic: str) -> ObjectHistory:
        """The append-only records of a topic (`promotions/production`, `reproductions/<model>`), in the store."""
        return ObjectHistory(self.store, topic)

    def topics(self, parent: str) -> list[str]:
        """The names of the histories under `parent` (`promotions`: the aliases that have one)."""
        prefix = f"history/{checked_topic(parent)}/"
        return sorted({key.removeprefix(prefix).split("/", 1)[0] for key in self.store.list(prefix) if "/" in key.removeprefix(prefix)})

    def by_digest(self, digest: str) -> Manifest | None:
        """A readable manifest of the artifact `digest`: the one whose fingerprint its publisher wrote beside the digest
        (`digests/<digest>`: two GETs, however many manifests the store holds, on a machine with no index yet), else, when
        that pointer is missing or names no manifest of these bytes any more (removed; an artifact published before
        pointers), asked of the index."""
        blob = self.store.get(self._digest_key(digest), limit=RECORD_BYTES)
        named = blob.data.decode(errors="replace").strip() if blob is not None else ""
        manifest = self._manifest(named) if NAME.match(named) else None
        if manifest is not None and manifest.digest == digest:
            return manifest
        return self._indexed(digest)

    def _indexed(self, digest: str) -> Manifest | None:
        """A readable manifest of the artifact `digest` (the first in fingerprint order), or None: asked of the index."""
        return next(iter(self.manifests(where=Where(digest=digest))), None)

    def manifests(self, kind: str | None = None, where: Where = EVERY, newest: int | None = None, refresh: bool = True) -> Iterator[Manifest]:
        """Every readable manifest (of `kind`, meeting `where`), in fingerprint order (`newest`: that many, the newest
        first); a damaged one is skipped with a warning. Listed from a local index of the store's manifests
        (`factory.registry.index`: one LIST of their keys and ETags, then a GET of each manifest new since the last
        listing; not `refresh`: as the index holds them now, for a reader that just asked its state), or, where no index
        can be kept, a GET of each."""
        yield from self.index().manifests(kind, where, parse_manifest, self._every, newest, refresh)

    def rows(self) -> list[ManifestRow]:
        """What a walk over the whole registry needs of each readable manifest, in fingerprint order, from the local
        index's columns (`ManifestIndex.rows`: no manifest parsed), or a GET of each where no index can be kept."""
        return self.index().rows(self._every)

    def _every(self) -> list[Manifest]:
        """Every readable manifest in the store, a GET of each."""
        return [m for name in self._manifest_versions() if (m := self._manifest(name)) is not None]

    def index(self) -> ManifestIndex:
        """The local index of the store's manifests that listings read (`factory.registry.index`)."""
        return ManifestIndex.of_versions(self.root / f"index-{hashlib.sha256(self.location.encode()).hexdigest()[:16]}.sqlite",
                                        self._manifest_versions, lambda name: m.to_json() if (m := self._manifest(name)) is not None else None)

    def _manifest_versions(self) -> dict[str, str]:
        """Fingerprint -> ETag of every manifest in the store, from one listing."""
        found = {key.removeprefix("manifests/").removesuffix(".json"): etag for key, etag in self.store.versions("manifests/").items()
                 if key.endswith(".json")}
        return {name: etag for name, etag in found.items() if NAME.match(name)}

    def work(self, fingerprint: str) -> Path:
        """A stage's scratch directory; a new one starts as the store's copy (`save_work`) of a run that stopped."""
        path = self.work_path(fingerprint)
        if not (path.is_dir() and any(path.iterdir())):
            prefix = f"work/{fingerprint}/"
            for key in self.store.list(prefix):
                target = path / key.removeprefix(prefix)
                target.parent.mkdir(parents=True, exist_ok=True)
                self.store.download(key, target)
                claimed = self.store.stat(key)
                if claimed is not None and claimed.sha256 not in (None, sha256_file(target)):
                    raise ArtifactError(f"{self.location}/{key} does not hash to the sha256 it was saved with; remove "
                                        f"{self.location}/{prefix} to train {fingerprint[:12]} from its start")
        path.mkdir(parents=True, exist_ok=True)
        return path

    def save_work(self, fingerprint: str) -> None:
        """Copy the scratch directory as it is now (a checkpoint was just saved) to `work/<fingerprint>/` in the store:
        its new and changed files, then the removal of those retention deleted. A file is hashed once per version
        (size, mtime, inode) in this process; a save in progress (`*.tmp`) is not copied."""
        path, prefix = self.work_path(fingerprint), f"work/{fingerprint}/"
        stored = {key.removeprefix(prefix): self.store.stat(key) for key in self.store.list(prefix)}
        found, _ = entries(path) if path.is_dir() else ({}, [])
        local = {name: info for name, info in found.items() if not any(part.endswith(".tmp") for part in name.split("/"))}
        for name, info in sorted(local.items(), key=lambda item: item[0].endswith(".json")):  # a checkpoint's record last
            version = (info.st_size, info.st_mtime_ns, info.st_ino)
            if (known := self._hashed.get((fingerprint, name))) is None or known[0] != version:
                known = self._hashed[(fingerprint, name)] = (version, sha256_file(path / name))
            copy = stored.get(name)
            if copy is None or copy.size != info.st_size or copy.sha256 != known[1]:
                self.store.upload(prefix + name, path / name, sha256=known[1])
        for name in sorted(stored.keys() - local.keys(), key=lambda name: not name.endswith(".json")):  # its record first
            self.store.delete(prefix + name)

    def works(self) -> dict[str, tuple[int, float]]:
        """Fingerprint -> (bytes, when last changed: POSIX seconds) of every stage's scratch directory, on this machine or
        saved in the store (`save_work`; a run that stopped elsewhere has no copy here): bytes of both copies, the later
        change of the two."""
        found = super().works()
        for key, listed in self.store.listing("work/").items():  # one listing: sizes and times without a request per object
            fingerprint = key.removeprefix("work/").split("/", 1)[0]
            if NAME.match(fingerprint):
                size, changed = found.get(fingerprint, (0, 0.0))
                found[fingerprint] = (size + listed.size, max(changed, listed.modified))
        return dict(sorted(found.items()))

    def drop_work(self, fingerprint: str) -> None:
        """Remove a stage's scratch directory, here and in the store (after its artifact is published)."""
        super().drop_work(fingerprint)
        for key in self.store.list(f"work/{_check(NAME, fingerprint, 'a fingerprint')}/"):
            self.store.delete(key)

    def publish(
        self,
        staging: Path,
        *,
        kind: str,
        fingerprint: str,
        config: Mapping[str, Any],
        inputs: Mapping[str, str],
        code: str,
        provenance: Provenance,
        summary: Mapping[str, Any],
    ) -> Manifest:
        """Upload a staged directory's files to their content address, then write the manifest if none exists; the
        manifest that stands (this one, or one another process wrote first)."""
        existing = self.lookup(fingerprint)
        if existing is not None:
            return existing
        files = hash_files(staging)
        if not files:
            raise ArtifactError(f"stage {kind!r} staged no files in {staging}; nothing to publish")
        digest = artifact_digest(files)
        trusted = self._trusted_etags(digest)
        etags = {}
        for name, entry in files.items():
            key = f"objects/{digest}/{name}"
            found = self.store.stat(key)
            if found is not None and found.size == entry["bytes"] and trusted.get(name) == found.etag:
                etags[name] = found.etag  # these bytes were published before and are still there
            else:
                etags[name] = self.store.upload(key, staging / name, sha256=entry["sha256"])
        self.store.put(f"verified/{digest}.json", json.dumps(etags, sort_keys=True).encode())
        manifest = Manifest.new(kind=kind, fingerprint=fingerprint, digest=digest, files=files, config=config, inputs=inputs,
                                code=code, provenance=provenance, summary=summary)
        text = json.dumps(manifest.to_json(), indent=2, sort_keys=True).encode()
        key = self._manifest_key(fingerprint)
        for _ in range(MANIFEST_WRITES):
            if self.store.create(key, text) is not None:
                break
            standing = self.lookup(fingerprint)  # another publisher was first, or a damaged manifest is there
            if standing is not None:
                return standing
            blob = self.store.get(key, limit=RECORD_BYTES)
            if blob is not None and self.store.replace(key, text, blob.etag) is not None:
                break  # the damaged one replaced; a replace that lost to another publisher's repair reads it next time
        else:
            raise ArtifactError(f"the manifest {self.location}/{key} changed under every one of {MANIFEST_WRITES} writes; "
                                "publish again")
        try:
            self.store.put(self._digest_key(digest), fingerprint.encode())
        except StorageError as e:  # a hint: without it a reader asks the index
            log.warning("published %s without its digest pointer: %s", digest[:12], e)
        return self.lookup(fingerprint) or manifest

    def verify(self) -> list[Damage]:
        """Every damaged manifest, then the damage of every artifact a readable manifest names (each once): each manifest
        read whole, each artifact's objects downloaded and hashed."""
        return damage_of(((f"{self.location}/{key}", functools.partial(self.read_manifest, key)) for key in self.store.list("manifests/")),
                         lambda manifest: (f"{self.location}/objects/{manifest.digest}", self.damage(manifest)))

    def damage(self, manifest: Manifest) -> list[str]:
        """What is wrong with a manifest's artifact, every byte read (what `factory registry verify` reports)."""
        problems = []
        with tempfile.TemporaryDirectory(prefix="verify-", dir=self._scratch()) as scratch:
            for name, entry in sorted(manifest.files.items()):
                key = f"objects/{manifest.digest}/{name}"
                if self.store.stat(key) is None:
                    problems.append(f"{name}: missing")
                    continue
                copy = Path(scratch) / "file"
                self.store.download(key, copy)
                if copy.stat().st_size != entry["bytes"]:
                    problems.append(f"{name}: {copy.stat().st_size} bytes, manifest says {entry['bytes']}")
                elif sha256_file(copy) != entry["sha256"]:
                    problems.append(f"{name}: sha256 differs from the manifest's")
        return problems

    def read_manifest(self, key: str, *, missing_ok: bool = False) -> Manifest | None:
        """The manifest at `key` (`manifests/<fingerprint>.json`), None when absent and `missing_ok`; ArtifactError when it
        is absent otherwise, not JSON, lacks a key, has a value of the wrong type or names another fingerprint than its key's."""
        try:
            blob = self.store.get(key, limit=RECORD_BYTES)
            if blob is None:
                if missing_ok:
                    return None
                raise ValueError("no such object")
            manifest = parse_manifest(json.loads(blob.data))
            if f"manifests/{manifest.fingerprint}.json" != key:
                raise ValueError(f"it is the manifest of {manifest.fingerprint[:76]!r}, not of its key's name")
            return manifest
        except (ArtifactError, ValueError, TypeError, RecursionError) as e:
            raise ArtifactError(f"manifest {self.location}/{key} is unreadable ({e}); remove it to recompute the stage") from e

    def _manifest(self, fingerprint: str) -> Manifest | None:
        """The manifest stored for `fingerprint`, or None (with a warning, once, when it is damaged)."""
        key = self._manifest_key(fingerprint)
        try:
            return self.read_manifest(key, missing_ok=True)
        except ArtifactError as e:
            if key not in _warned:
                _warned.add(key)
                log.warning("skipping damaged %s", e)
            return None

    def _intact(self, manifest: Manifest, rehash: bool) -> bool:
        """Every file is there with its size and the ETag recorded when its sha256 was checked, or hashes right now."""
        if rehash:
            return not self.damage(manifest)
        trusted = self._trusted_etags(manifest.digest)
        unchecked = {}
        for name, entry in manifest.files.items():
            found = self.store.stat(f"objects/{manifest.digest}/{name}")
            if found is None or found.size != entry["bytes"]:
                return False
            if trusted.get(name) != found.etag:
                unchecked[name] = found.etag
        if unchecked:
            partial = Manifest(**{**manifest.to_json(), "files": {name: manifest.files[name] for name in unchecked}})
            if self.damage(partial):
                return False
            self.store.put(f"verified/{manifest.digest}.json", json.dumps({**trusted, **unchecked}, sort_keys=True).encode())
        return True

    def _trusted_etags(self, digest: str) -> dict[str, str]:
        """The ETag of each file of `digest` when its sha256 was last checked (empty when none is recorded or readable)."""
        blob = self.store.get(f"verified/{digest}.json", limit=RECORD_BYTES)
        try:
            etags = json.loads(blob.data) if blob is not None else {}
        except (ValueError, RecursionError):
            return {}
        return {k: v for k, v in etags.items() if isinstance(v, str)} if isinstance(etags, dict) else {}

    def _check_layout(self, setting: str) -> None:
        """Mark an empty store with this factory's layout; refuse one that another factory wrote with a newer layout. One
        request for a store that has its mark (every open but the first)."""
        blob = self.store.get("layout.json", limit=RECORD_BYTES)
        if blob is None:
            if self.store.create("layout.json", json.dumps({"layout": LAYOUT}).encode()) is not None:
                return
            blob = self.store.get("layout.json", limit=RECORD_BYTES)  # another factory marked it a moment ago
        try:
            layout = json.loads(blob.data)["layout"] if blob is not None else LAYOUT
            if type(layout) is not int:
                raise ValueError(f"layout {str(layout)[:20]!r} is not a number")
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            raise ConfigError(f"{setting}={self.location}: its layout.json is unreadable ({e}); point {setting} at the "
                              "factory's own prefix") from e
        if layout > LAYOUT:
            raise ConfigError(f"{setting}={self.location}: written by a newer factory (layout {layout}; this one reads "
                              f"layout {LAYOUT}); upgrade the factory, or point {setting} at another prefix")

    def _scratch(self) -> Path:
        path = self.root / "staging"
        path.mkdir(parents=True, exist_ok=True)
        return path

    @staticmethod
    def _manifest_key(fingerprint: str) -> str:
        return f"manifests/{_check(NAME, fingerprint, 'a fingerprint')}.json"

    @staticmethod
    def _digest_key(digest: str) -> str:
        return f"digests/{_check(DIGEST, digest, 'an artifact digest')}"

    @staticmethod
    def _lease_key(fingerprint: str) -> str:
        return f"leases/{_check(NAME, fingerprint, 'a fingerprint')}.lease"


def _place(checked: Path, target: Path) -> None:
    """Move a checked copy (a file or a directory) to `target`, then make it read-only: a directory must still be
    writable to be moved to another parent. Another process that put the same checked copy there first wins."""
    try:
        os.rename(checked, target)
    except OSError as e:
        if not target.exists():
            raise ArtifactError(f"cannot keep a copy at {target}: {e.strerror or e}") from e
        return
    make_read_only(target)


def _check(pattern: Any, value: str, what: str) -> str:
    if not isinstance(value, str) or not pattern.match(value):
        raise ArtifactError(f"{value!r} is not {what}")
    return value


APPEND_TOKEN = "append_token"
"""A key of each history record in the store: drawn by the append that wrote it (how it knows its own record again),
left out of what `records` gives."""


class ObjectHistory:
    """The records of one topic in an object store, oldest first: each is created under the next free number only if
    that number is free (`If-None-Match: *`), so it appears whole or not at all and two writers never take one number."""

    def __init__(self, store: ObjectStore, topic: str) -> None:
        self.store = store
        self.prefix = f"history/{checked_topic(topic)}/"

    def records(self) -> list[dict[str, Any]]:
        """Every record, oldest first, each with its `seq`."""
        found = []
        for seq, key in self._numbered():
            blob = self.store.get(key, limit=RECORD_BYTES)
            if blob is None:
                continue
            try:
                data = json.loads(blob.data)
            except (ValueError, RecursionError) as e:
                raise ArtifactError(f"history record {self.store.uri}/{key} is damaged ({e}); restore it from a backup, or "
                                    "remove it and the records after it to forget them") from e
            found.append({**{k: v for k, v in parse_record(data, f"{self.store.uri}/{key}").items() if k != APPEND_TOKEN}, "seq": seq})
        return found

    def append(self, record: Mapping[str, Any]) -> int:
        """Add a record under the next number; that number. A create refused because the number is taken is tried under
        the next, unless the record there is this one, token and all (`APPEND_TOKEN`, which each append draws): the create
        was carried out and its answer lost (a cut connection, a 500), then sent again and refused, so it is not written
        twice."""
        text = json.dumps({**record, APPEND_TOKEN: uuid.uuid4().hex}, indent=2, sort_keys=True).encode()
        while True:
            seq = max((seq for seq, _ in self._numbered()), default=0) + 1
            key = f"{self.prefix}{seq:06d}.json"
            if self.store.create(key, text) is not None:
                return seq
            standing = self.store.get(key, limit=RECORD_BYTES)
            if standing is not None and standing.data == text:
                return seq

    def _numbered(self) -> list[tuple[int, str]]:
        return sorted((int(m.group(1)), key) for key in self.store.list(self.prefix)
                      if (m := RECORD.match(key.removeprefix(self.prefix))))
