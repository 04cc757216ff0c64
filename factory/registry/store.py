"""Immutable, content-addressed artifacts on local disk, found by stage fingerprint.

Layout under the root:
    objects/<digest>/...          the artifact's files, read-only once published
    manifests/<shard>/<fingerprint>.json
                                  what produced it: stage, config, inputs, commit, sha256 per file (the shard: two hex
                                  digits of the fingerprint's sha256, `factory.registry.index.ManifestDirectory`;
                                  a registry written before shards has `manifests/<fingerprint>.json`, read as well
                                  and moved into its shard by the index's next reader)
    verified/<digest>.json        each file's size, mtime and inode when its sha256 was last checked
    staging/                      work in progress; never read by anyone but its writer

A stage writes into a staging directory; `publish` hashes, fsyncs and renames it into place
(a rename within one filesystem is atomic), then links the manifest in without overwriting.

A lookup proves an artifact intact without reading its bytes again when every file still has the
size, mtime and inode recorded when its sha256 was last checked (as git's index does): writing a
file changes its mtime. An entry whose mtime is not older than the record itself is "racily
clean" (a write in the same clock tick would not show) and is hashed again. `lookup(...,
rehash=True)` reads every byte; loading a checkpoint checks its own sha256 as well.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from factory.atomic import fsync_directory, synced_temp, write_atomic
from factory.errors import ArtifactError
from factory.registry.files import (
    DIGEST,
    NAME,
    entries,
    hash_files,
    load_record,
    make_read_only,
    make_writable,
    read_record,
    sha256_file,
    structural_damage,
)
from factory.registry.history import History, checked_topic
from factory.registry.index import EVERY, INDEX_NAME, ManifestDirectory, ManifestIndex, ManifestRow, Where, shard_of
from factory.registry.lease import Holder, hold, read_holder
from factory.registry.verify import Damage, damage_of, object_damage

if TYPE_CHECKING:
    from factory.registry.seam import Registry

MANIFEST_VERSION = 1
log = logging.getLogger(__name__)
_warned: set[str] = set()


@dataclass(frozen=True, kw_only=True, slots=True)
class Manifest:
    """Provenance of one published artifact, stored next to it."""

    kind: str
    fingerprint: str
    digest: str
    files: Mapping[str, Mapping[str, Any]]
    config: Mapping[str, Any]
    inputs: Mapping[str, str]
    code: str
    experiment: str
    config_hash: str
    git_commit: str
    created: str
    summary: Mapping[str, Any]
    run_id: str = ""
    version: int = MANIFEST_VERSION
    base: Mapping[str, Any] = field(default_factory=dict)
    """For an experiment that starts from a model made elsewhere: its `from` and the model it resolved to when the run
    was planned (section, from, model, experiment, said)."""

    @classmethod
    def new(cls, *, kind: str, fingerprint: str, digest: str, files: Mapping[str, Mapping[str, Any]], config: Mapping[str, Any],
            inputs: Mapping[str, str], code: str, provenance: Provenance, summary: Mapping[str, Any]) -> Manifest:
        """The manifest of an artifact published now."""
        return cls(kind=kind, fingerprint=fingerprint, digest=digest, files=files, config=dict(config), inputs=dict(inputs),
                   code=code, experiment=provenance.experiment, config_hash=provenance.config_hash,
                   git_commit=provenance.git_commit, created=datetime.now(UTC).isoformat(timespec="seconds"),
                   summary=dict(summary), run_id=provenance.run_id, base=dict(provenance.base))

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form."""
        return asdict(self)

    def files_under(self, name: str) -> list[str]:
        """The artifact's files that make up its part `name`: that file, or the files under that directory."""
        return [key for key in self.files if key == name or key.startswith(f"{name}/")]

    @property
    def size(self) -> int:
        """The bytes of the artifact's files, as the manifest records them."""
        return sum(entry["bytes"] for entry in self.files.values())

    def metadata(self) -> dict[str, Any]:
        """Flat key/values shown on the materialization: provenance first, then the stage's summary."""
        return {
            "digest": self.digest,
            "fingerprint": self.fingerprint,
            "git_commit": self.git_commit,
            "config_hash": self.config_hash,
            "git_dirty": self.git_commit.endswith("-dirty"),
            "code": self.code,
            "produced_for": self.experiment,
            "produced_by_run": self.run_id or "outside Dagster",
            "created": self.created,
            "inputs": ", ".join(f"{name}={digest[:12]}" for name, digest in sorted(self.inputs.items())) or "none",
            **({"starts_from": self.base["said"]} if self.base.get("said") else {}),
            **{f"summary/{key}": value for key, value in sorted(self.summary.items())},
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Provenance:
    """Who asked for an artifact: recorded in its manifest, not part of its fingerprint."""

    experiment: str
    config_hash: str
    git_commit: str
    run_id: str = ""
    base: Mapping[str, Any] = field(default_factory=dict)
    """What the experiment's `from` resolved to (`factory.ops.bases.Base.record`); empty when it starts from its own."""


class Scratch:
    """A registry's local directories: staging (an artifact being written) and work (a stage's scratch that outlives its
    process: checkpoints to resume from). Under `root`, on local disk whatever the registry's store."""

    root: Path

    def work(self, fingerprint: str) -> Path:
        """A stage's scratch directory that outlives its process (checkpoints to resume from); removed once it publishes."""
        path = self.work_path(fingerprint)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def work_path(self, fingerprint: str) -> Path:
        """Where a stage's scratch directory is while it runs (it may not exist)."""
        if not isinstance(fingerprint, str) or not NAME.match(fingerprint):
            raise ArtifactError(f"{fingerprint!r} is not a fingerprint (letters, digits, '_', '.', '-')")
        return self.root / "work" / fingerprint

    def works(self) -> dict[str, tuple[int, float]]:
        """Fingerprint -> (bytes, when last changed: POSIX seconds) of every stage's scratch directory on this machine."""
        found: dict[str, tuple[int, float]] = {}
        directory = self.root / "work"
        for path in sorted(directory.iterdir()) if directory.is_dir() else []:
            if path.is_dir() and not path.is_symlink() and NAME.match(path.name):
                files, _ = entries(path)
                changed = max([path.stat().st_mtime, *(info.st_mtime for info in files.values())])
                found[path.name] = (sum(info.st_size for info in files.values()), changed)
        return found

    def drop_work(self, fingerprint: str) -> None:
        """Remove a stage's scratch directory (after its artifact is published)."""
        shutil.rmtree(self.work_path(fingerprint), ignore_errors=True)

    def save_work(self, fingerprint: str) -> None:
        """Make the scratch directory as it is now (a checkpoint was just saved) the one a relaunch resumes from, on any
        machine. Here it is: the directory is on the disk every relaunch reads."""

    @contextlib.contextmanager
    def staging(self) -> Iterator[Path]:
        """A fresh directory to write an artifact into; removed unless it was published."""
        (self.root / "staging").mkdir(parents=True, exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix="stage-", dir=self.root / "staging"))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)


class ArtifactStore(Scratch):
    """A local directory of published artifacts."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self.location = str(self.root)

    def path(self, digest: str) -> Path:
        """Directory of a published artifact."""
        if not isinstance(digest, str) or not DIGEST.match(digest):
            raise ArtifactError(f"{digest!r} is not an artifact digest (64 hex digits)")
        return self.root / "objects" / digest

    def where(self, digest: str) -> str:
        """Where a published artifact is, to show people and Dagster: here, its directory."""
        return str(self.path(digest))

    def lookup(self, fingerprint: str, rehash: bool = False) -> Manifest | None:
        """The manifest for a fingerprint if its artifact is published and intact, else None.

        Files unchanged since their sha256 was last checked are not read again, unless `rehash`."""
        flat = self._name_text("manifests", fingerprint, ".json")  # text: a miss builds no Path (a backfill plans thousands)
        sharded = self._manifest_text(fingerprint)
        # in its shard; else one of before shards; else in its shard after all (moved there since the first look)
        if not os.path.lexists(path := sharded) and not os.path.lexists(path := flat) and not os.path.lexists(path := sharded):
            return None
        manifest = self._read_or_warn(Path(path))
        return manifest if manifest is not None and self._intact(manifest, rehash) else None

    def read(self, manifest: Manifest, name: str) -> bytes | None:
        """The bytes of one file of a published artifact (`name` relative to it), None when the artifact has no such
        file: for the small files a reader wants from a large artifact (a training's metrics beside its checkpoints)."""
        if name not in manifest.files:
            return None
        try:
            return (self.path(manifest.digest) / name).read_bytes()
        except OSError as e:
            raise ArtifactError(f"artifact {manifest.digest[:12]} in {self.root}: {name} cannot be read ({e.strerror or e}); "
                                "rerun its stage to publish it again") from e

    def fetch(self, manifest: Manifest, name: str) -> Path:
        """Where one file or directory of a published artifact (`name` relative to it) is on local disk: for a reader of
        one part of a large artifact (an evaluation of one of a training's checkpoints)."""
        return self.path(manifest.digest) / name

    def open(self, digest: str) -> Path:
        """Directory of a published artifact; raise if it is not there."""
        path = self.path(digest)
        if not path.is_dir():
            raise ArtifactError(f"artifact {digest[:12]} is not in the registry at {self.root}; rerun its stage")
        return path

    def set_ref(self, name: str, digest: str) -> None:
        """Point the named ref (like a git branch) at a published artifact, atomically."""
        self.open(digest)
        _write_private(self._name_path("refs", name, ""), digest)

    def ref(self, name: str) -> str | None:
        """The digest a named ref points at, or None."""
        try:
            digest = read_record(self._name_path("refs", name, "")).decode().strip()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as e:
            log.warning("ref %s in %s cannot be read (%s); it names nothing until it is set again", name, self.root, e)
            return None
        return digest if DIGEST.match(digest) else None

    def lease(self, fingerprint: str, owner: str, **options: Any) -> contextlib.AbstractContextManager[None]:
        """Hold the lease on computing `fingerprint` (waiting while someone else holds it)."""
        return hold(self._lease_path(fingerprint), owner, **options)

    def history(self, topic: str) -> History:
        """The append-only records of a topic (`promotions/production`, `reproductions/<model>`)."""
        return History(self.root, topic)

    def topics(self, parent: str) -> list[str]:
        """The names of the histories under `parent` (`promotions`: the aliases that have one)."""
        directory = self.root / "history" / checked_topic(parent)
        return sorted(p.name for p in directory.iterdir() if p.is_dir()) if directory.is_dir() else []

    def holder(self, fingerprint: str) -> Holder | None:
        """Who is computing `fingerprint` right now, if anyone."""
        return read_holder(self._lease_path(fingerprint))

    def holders(self) -> list[Holder]:
        """Whoever holds a lease in the registry now (including holders that died: `abandoned` tells)."""
        directory = self.root / "leases"
        paths = sorted(p for p in directory.glob("*.lease") if NAME.match(p.stem)) if directory.is_dir() else []
        return [holder for path in paths if (holder := read_holder(path)) is not None]

    def remove(self, manifest: Manifest | ManifestRow) -> int | None:
        """Remove a published artifact (`factory registry gc`; the caller holds its lease): the manifest first, after which
        the artifact does not exist (a lookup misses and its stage computes it again), then its files, unless another
        manifest names the same bytes. The bytes freed; None (and nothing removed) when the manifest is no longer this one."""
        path = next((path for path in (self.manifest_path(manifest.fingerprint), self._name_path("manifests", manifest.fingerprint, ".json"))
                     if os.path.lexists(path)), None)
        current = self._read_or_warn(path) if path is not None else None
        if current is None or current.digest != manifest.digest:
            return None
        with self.staging() as aside:
            os.rename(path, aside / "manifest.json")
            fsync_directory(path.parent)
            if any(True for _ in self.manifests(where=Where(digest=manifest.digest))):
                return 0
            objects = self.path(manifest.digest)
            with contextlib.suppress(FileNotFoundError):
                os.chmod(objects, 0o755)  # moving a directory to another parent writes its `..`
                os.rename(objects, aside / "objects")
                make_writable(aside / "objects")
            with contextlib.suppress(FileNotFoundError):
                self._stamps_path(manifest.digest).unlink()
        return manifest.size

    def by_digest(self, digest: str) -> Manifest | None:
        """A readable manifest of the artifact `digest` (the first in fingerprint order), or None: asked of the index."""
        return next(iter(self.manifests(where=Where(digest=digest))), None)

    def manifests(self, kind: str | None = None, where: Where = EVERY, newest: int | None = None, refresh: bool = True) -> Iterator[Manifest]:
        """Every readable manifest in the registry (of `kind`, meeting `where`), in fingerprint order (`newest`: that many,
        the newest first); a damaged one is skipped with a warning. Listed from the registry's index
        (`factory.registry.index`; not `refresh`: as the index holds them now, for a reader that just asked its state), or,
        where this process cannot write the index, from the manifest files themselves."""
        if not (self.root / "manifests").is_dir():
            return
        yield from self.index().manifests(kind, where, parse_manifest, self._every, newest, refresh)

    def rows(self) -> list[ManifestRow]:
        """What a walk over the whole registry needs of each readable manifest, in fingerprint order, from the index's
        columns (`ManifestIndex.rows`: no manifest parsed), or from the manifest files where this process cannot write it."""
        return self.index().rows(self._every) if (self.root / "manifests").is_dir() else []

    def _every(self) -> list[Manifest]:
        """Every readable manifest, each file read."""
        return [m for path in self.manifest_paths() if (m := self._read_or_warn(path)) is not None]

    def index(self) -> ManifestIndex:
        """The index of the registry's manifests that listings read (`factory.registry.index`)."""
        return ManifestIndex.of_directory(self.root / INDEX_NAME, ManifestDirectory(self.root / "manifests"),
                                          lambda path: m.to_json() if (m := self._read_or_warn(path)) is not None else None)

    def verify(self) -> list[Damage]:
        """Every damaged manifest, then the damage of every artifact a readable manifest names (each once), every byte read."""
        def artifact(manifest: Manifest) -> tuple[str, list[str]]:
            base = self.path(manifest.digest)
            return str(base), object_damage(base, manifest.files)

        return damage_of(((str(path), functools.partial(self.read_manifest, path)) for path in self.manifest_paths()), artifact)

    def manifest_paths(self) -> list[Path]:
        """Every manifest file in the registry, readable or not, in name order."""
        return ManifestDirectory(self.root / "manifests").files()

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
        """Move a staged directory to its content address and record its manifest."""
        existing = self.lookup(fingerprint)
        if existing is not None:
            return existing
        files = hash_files(staging)
        if not files:
            raise ArtifactError(f"stage {kind!r} staged no files in {staging}; nothing to publish")
        digest = artifact_digest(files)
        target = self.path(digest)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists() and self._matches(target, files):
            shutil.rmtree(staging)  # the same bytes were published before: keep the first copy
        else:
            if os.path.lexists(target):  # damaged copy of these bytes (or a link): move it aside, then put the good one in
                aside = staging.with_name(f"damaged-{staging.name}")
                make_writable(target)  # never follows a link: files outside the registry keep their modes
                os.rename(target, aside)  # a link is moved itself, never what it points at
                if aside.is_symlink() or not aside.is_dir():
                    aside.unlink()
                else:
                    shutil.rmtree(aside)
            fsync_directory(staging)
            try:
                os.rename(staging, target)
            except OSError as e:  # another process published the same bytes a moment ago
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not self._matches(target, files):
                    raise
                shutil.rmtree(staging)
            else:
                fsync_directory(target.parent)
                make_read_only(target)
                self._record_checked(digest, files)  # hashed a moment ago, in a directory only this process writes
        manifest = Manifest.new(kind=kind, fingerprint=fingerprint, digest=digest, files=files, config=config, inputs=inputs,
                                code=code, provenance=provenance, summary=summary)
        self._write_manifest(manifest)
        return self.lookup(fingerprint) or manifest

    def read_manifest(self, path: Path) -> Manifest:
        """Parse one manifest file; raise ArtifactError when it is not a regular file of JSON, lacks a key, has a value of
        the wrong type, or names another fingerprint than its file's."""
        try:
            manifest = parse_manifest(load_record(path))
            if manifest.fingerprint != path.name.removesuffix(".json"):
                raise ValueError(f"it is the manifest of {manifest.fingerprint[:76]!r}, not of its file's name")
            if path.parent.name not in ("manifests", shard_of(manifest.fingerprint)):
                raise ValueError(f"it is in shard {path.parent.name[:8]!r}, its fingerprint's is {shard_of(manifest.fingerprint)!r}")
            return manifest
        except (OSError, ValueError, TypeError) as e:
            raise ArtifactError(f"manifest {path} is unreadable ({e}); remove it to recompute the stage") from e

    def _read_or_warn(self, path: Path) -> Manifest | None:
        """The manifest at `path`, or None with a warning (once per file in this process) when it is damaged."""
        try:
            return self.read_manifest(path)
        except ArtifactError as e:
            if str(path) not in _warned:
                _warned.add(str(path))
                log.warning("skipping damaged %s", e)
            return None

    def _lease_path(self, fingerprint: str) -> Path:
        return self._name_path("leases", fingerprint, ".lease")

    def manifest_path(self, fingerprint: str) -> Path:
        """Where the manifest of `fingerprint` is written (in its shard)."""
        return Path(self._manifest_text(fingerprint))

    def _manifest_text(self, fingerprint: str) -> str:
        return self._name_text(f"manifests/{shard_of(_registry_name(fingerprint))}", fingerprint, ".json")

    def _stamps_path(self, digest: str) -> Path:
        self.path(digest)  # refuses what is not a digest
        return self.root / "verified" / f"{digest}.json"

    def _name_path(self, directory: str, name: str, suffix: str) -> Path:
        """`<root>/<directory>/<name><suffix>`, for a name that is one path component (a fingerprint, a ref)."""
        return Path(self._name_text(directory, name, suffix))

    def _name_text(self, directory: str, name: str, suffix: str) -> str:
        """`_name_path` as text."""
        return f"{self.location.rstrip('/')}/{directory}/{_registry_name(name)}{suffix}"  # not os.path.join: it takes as long as a miss's lexists

    def _intact(self, manifest: Manifest, rehash: bool) -> bool:
        """Every file is there with its size, and its bytes hash as recorded (unchanged since last checked, or hashed now)."""
        base = self.path(manifest.digest)
        problems, found = structural_damage(base, manifest.files)  # lstat only: a symlink is damage, never a hit
        if problems:
            return False
        current = {name: _stamp(found[name]) for name in manifest.files}
        trusted = {} if rehash else self._trusted_stamps(manifest.digest)
        unchecked = [name for name in manifest.files if trusted.get(name) != current[name]]
        if any(sha256_file(base / name) != manifest.files[name]["sha256"] for name in unchecked):
            return False
        if unchecked:
            self._write_stamps(manifest.digest, current)
        return True

    def _record_checked(self, digest: str, files: Mapping[str, Mapping[str, Any]]) -> None:
        """Record the stamps of files whose sha256 was just checked."""
        base = self.path(digest)
        self._write_stamps(digest, {name: _stamp(os.lstat(base / name)) for name in files})

    def _write_stamps(self, digest: str, stamps: dict[str, list[int]]) -> None:
        with contextlib.suppress(OSError):  # a cache: a registry this process cannot write to is still read, by hashing
            _write_private(self._stamps_path(digest), json.dumps(stamps, sort_keys=True))

    def _trusted_stamps(self, digest: str) -> dict[str, list[int]]:
        """The recorded stamps that prove their file unchanged: those of files last written before the record was."""
        path = self._stamps_path(digest)
        try:
            recorded_ns = os.lstat(path).st_mtime_ns
            stamps = load_record(path)
        except (OSError, ValueError):
            return {}
        if not isinstance(stamps, dict):
            return {}
        return {name: value for name, value in stamps.items()
                if isinstance(value, list) and len(value) == 4 and all(type(n) is int for n in value)
                and value[1] < recorded_ns and value[3] < recorded_ns}

    @staticmethod
    def _matches(base: Path, files: Mapping[str, Mapping[str, Any]]) -> bool:
        if structural_damage(base, files)[0]:
            return False
        return all(sha256_file(base / name) == entry["sha256"] for name, entry in files.items())

    def _write_manifest(self, manifest: Manifest) -> None:
        final = self.manifest_path(manifest.fingerprint)
        if not final.parent.is_dir():  # the shard's first manifest: the shard made, and its entry synced
            final.parent.mkdir(parents=True, exist_ok=True)
            fsync_directory(final.parent.parent)
        with synced_temp(final, json.dumps(manifest.to_json(), indent=2, sort_keys=True), mode=0o600) as tmp:
            try:
                os.link(tmp, final)  # never replaces: the first manifest for a fingerprint stands
            except FileExistsError:
                if self.lookup(manifest.fingerprint) is None:
                    os.replace(tmp, final)  # the old one pointed at a damaged artifact
            fsync_directory(final.parent)
        with contextlib.suppress(FileNotFoundError):  # one of before shards, which pointed at a damaged artifact: replaced
            self._name_path("manifests", manifest.fingerprint, ".json").unlink()


def _registry_name(name: str) -> str:
    """`name`, when it is one path component the registry names a file by (a fingerprint, a ref); else ArtifactError."""
    if not isinstance(name, str) or not NAME.match(name):
        raise ArtifactError(f"{name!r} is not a registry name (letters, digits, '_', '.', '-'; 128 at most)")
    return name


def _write_private(path: Path, text: str) -> None:
    """Replace a small registry file atomically (its directory made if need be), readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text, mode=0o600)


def _stamp(info: os.stat_result) -> list[int]:
    """What changes when a file's bytes are written: its size and mtime (and its inode, when it is replaced), and its
    ctime, which no one can set back: restoring the mtime after a write (`touch -d`, `os.utime`) moves the ctime on."""
    return [info.st_size, info.st_mtime_ns, info.st_ino, info.st_ctime_ns]


def _inside(name: str) -> bool:
    """Whether a manifest's file name is a relative path that stays inside its artifact's directory."""
    parts = name.split("/")
    return bool(name) and "\0" not in name and not name.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def manifest_of(registry: Registry, digest: str) -> Manifest:
    """The manifest of the published artifact `digest` (`Registry.by_digest`), for a
    reader of one of its files (`read`, `fetch`); ArtifactError when none is published."""
    found = registry.by_digest(digest) if DIGEST.match(str(digest)) else None
    if found is None:
        raise ArtifactError(f"artifact {str(digest)[:12]} is not in the registry at {registry.location}; rerun its stage")
    return found


def read_required(registry: Registry, manifest: Manifest, name: str) -> bytes:
    """The bytes of one file of a published artifact (`registry.read`); ArtifactError naming it when the artifact has none."""
    data = registry.read(manifest, name)
    if data is None:
        raise ArtifactError(f"the {manifest.kind} artifact {manifest.digest[:12]} has no {name}: rerun its stage to publish it again")
    return data


def artifact_digest(files: Mapping[str, Mapping[str, Any]]) -> str:
    """An artifact's digest: the sha256 of its file listing (each name with its sha256)."""
    listing = "\n".join(f"{name}\0{entry['sha256']}" for name, entry in sorted(files.items()))
    return hashlib.sha256(listing.encode()).hexdigest()


_MANIFEST_TYPES: dict[str, type] = {"files": dict, "config": dict, "inputs": dict, "summary": dict, "version": int, "base": dict}
_OPTIONAL = ("run_id", "version", "base")
"""Keys that manifests written before them lack."""
_TYPE_NAMES = {dict: "an object", int: "an integer", str: "a string"}
_FIELD_TYPES = {f.name: _MANIFEST_TYPES.get(f.name, str) for f in fields(Manifest)}
"""Every key of a manifest and the type of its value (a listing parses thousands: worked out once)."""


def parse_manifest(data: Any) -> Manifest:
    """A Manifest from parsed JSON, checking every key is present and of its type (TypeError names what is wrong), and
    that its digest, fingerprint, file names and inputs name nothing outside the registry (ValueError)."""
    if not isinstance(data, dict):
        raise TypeError(f"expected a JSON object, found {type(data).__name__}")
    missing = [name for name in _FIELD_TYPES if name not in data and name not in _OPTIONAL]
    if missing:
        raise TypeError(f"missing keys: {', '.join(missing)}")
    for name, expected in _FIELD_TYPES.items():
        if name in data and not isinstance(data[name], expected):
            raise TypeError(f"{name} is {type(data[name]).__name__}, expected {_TYPE_NAMES[expected]}")
    if not DIGEST.match(data["digest"]):
        raise ValueError(f"digest {data['digest'][:80]!r} is not 64 hex digits")
    if not NAME.match(data["fingerprint"]):
        raise ValueError(f"fingerprint {data['fingerprint'][:80]!r} is not a registry name")
    for name, entry in data["files"].items():
        if not _inside(name):
            raise ValueError(f"files names {name[:80]!r}, which is not a path inside the artifact")
        if not (isinstance(entry, dict) and isinstance(entry.get("sha256"), str) and isinstance(entry.get("bytes"), int)):
            raise TypeError(f"files.{name} needs sha256 (a string) and bytes (an integer)")
        if entry["bytes"] < 0:
            raise ValueError(f"files.{name} has {entry['bytes']} bytes")
    if sum(entry["bytes"] for entry in data["files"].values()) >= 2**63:  # what the index's integers hold
        raise ValueError("files add up to 2**63 bytes or more")
    if not all(isinstance(value, str) and DIGEST.match(value) for value in data["inputs"].values()):
        raise TypeError("inputs must map names to digests (64 hex digits)")
    return Manifest(**data)
