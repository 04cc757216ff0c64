"""The registry's seam: what every registry offers, whatever holds its artifacts. Everything outside `factory.registry`
reads and writes artifacts through a `Registry` (`open_registry` gives one), never through a class behind it.

Two registries implement it:
- `ArtifactStore` (`factory.registry.store`), the embedded default: a directory on a POSIX disk, where an artifact is
  published by renaming its staging directory into place and read where it lies (no copy), its files proven unchanged
  by their size, mtime, ctime and inode;
- `ObjectRegistry` (`factory.registry.objects`), over any `factory.storage.ObjectStore` (`s3://`; `file://` too): no rename, so
  objects first and the manifest last with conditional writes; an artifact read is copied into a bounded local cache,
  hashed on the way.
A new place to keep artifacts (GCS, Azure) is an `ObjectStore` backend (`factory.storage.BACKENDS`), which
`ObjectRegistry` serves unchanged. `tests/registry/test_seam.py` checks that both registries offer every member below
with the same parameters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from factory.registry.index import ManifestIndex, ManifestRow, Where
    from factory.registry.lease import Holder
    from factory.registry.store import Manifest, Provenance
    from factory.registry.verify import Damage


@runtime_checkable
class Records(Protocol):
    """An append-only list of JSON records (a topic's history: promotions of an alias, reproductions of a model)."""

    def records(self) -> list[dict[str, Any]]:
        """Every record, oldest first."""
        ...

    def append(self, record: Mapping[str, Any]) -> int:
        """Add a record after every other (two writers never take one number): its number."""
        ...


@runtime_checkable
class Registry(Protocol):
    """Immutable, content-addressed artifacts found by stage fingerprint, their manifests, leases, refs and histories, and
    the local directories a stage writes in (staging, work)."""

    root: Path
    """The local directory: staging, work, and whatever the registry keeps on this machine (its index, copies read)."""
    location: str
    """Where the artifacts are, to show people: the directory, or the store's URI."""

    # Artifacts
    def lookup(self, fingerprint: str, rehash: bool = False) -> Manifest | None:
        """The manifest of `fingerprint` if its artifact is published and intact (every byte read when `rehash`), else None."""
        ...

    def publish(self, staging: Path, *, kind: str, fingerprint: str, config: Mapping[str, Any], inputs: Mapping[str, str],
                code: str, provenance: Provenance, summary: Mapping[str, Any]) -> Manifest:
        """Make a staged directory the artifact of `fingerprint`: the manifest that stands (this one, or another process's)."""
        ...

    def open(self, digest: str) -> Path:
        """A published artifact's directory on local disk; ArtifactError when it is not in the registry."""
        ...

    def path(self, digest: str) -> Path:
        """A published artifact's directory on local disk: on disk, where it is (it may not exist); from an object
        store, its local copy, fetched as `open` fetches it when the store has it."""
        ...

    def where(self, digest: str) -> str:
        """Where a published artifact is, to show people and Dagster, reading nothing."""
        ...

    def read(self, manifest: Manifest, name: str) -> bytes | None:
        """The bytes of one file of an artifact, None when it has no such file."""
        ...

    def fetch(self, manifest: Manifest, name: str) -> Path:
        """One file or directory of an artifact on local disk, without the rest of it."""
        ...

    def remove(self, manifest: Manifest | ManifestRow) -> int | None:
        """Remove an artifact (its manifest first): the bytes freed, None when the manifest is no longer this one."""
        ...

    def verify(self) -> list[Damage]:
        """Every damaged manifest and artifact, every byte read."""
        ...

    # Listings (from the registry's index)
    def manifests(self, kind: str | None = None, where: Where = ..., newest: int | None = None,
                  refresh: bool = True) -> Iterator[Manifest]:
        """Every readable manifest (of `kind`, meeting `where`), in fingerprint order (`newest`: that many, newest first)."""
        ...

    def by_digest(self, digest: str) -> Manifest | None:
        """A readable manifest of the artifact `digest`, or None."""
        ...

    def rows(self) -> list[ManifestRow]:
        """What a walk over the whole registry needs of each readable manifest, none parsed."""
        ...

    def index(self) -> ManifestIndex:
        """The index of the manifests that listings read."""
        ...

    # Leases, refs, histories
    def lease(self, fingerprint: str, owner: str, **options: Any) -> contextlib.AbstractContextManager[None]:
        """Hold the lease on computing `fingerprint`, waiting while someone else holds it."""
        ...

    def holder(self, fingerprint: str) -> Holder | None:
        """Who is computing `fingerprint` now, if anyone."""
        ...

    def holders(self) -> list[Holder]:
        """Whoever holds a lease now (holders that died included)."""
        ...

    def set_ref(self, name: str, digest: str) -> None:
        """Point a named ref at a published artifact."""
        ...

    def ref(self, name: str) -> str | None:
        """The digest a named ref points at, or None."""
        ...

    def history(self, topic: str) -> Records:
        """The append-only records of a topic (`promotions/production`, `reproductions/<model>`)."""
        ...

    def topics(self, parent: str) -> list[str]:
        """The names of the histories under `parent`."""
        ...

    # A stage's local directories
    def staging(self) -> contextlib.AbstractContextManager[Path]:
        """A fresh directory to write an artifact into; removed unless it was published."""
        ...

    def work(self, fingerprint: str) -> Path:
        """A stage's scratch directory that outlives its process (checkpoints to resume from)."""
        ...

    def work_path(self, fingerprint: str) -> Path:
        """Where a stage's scratch directory is while it runs (it may not exist)."""
        ...

    def works(self) -> dict[str, tuple[int, float]]:
        """Fingerprint -> (bytes, when last changed) of every stage's scratch directory."""
        ...

    def save_work(self, fingerprint: str) -> None:
        """Make the scratch directory as it is now the one a relaunch resumes from, on any machine."""
        ...

    def drop_work(self, fingerprint: str) -> None:
        """Remove a stage's scratch directory (after its artifact is published)."""
        ...
