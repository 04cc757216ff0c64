"""The storage seam: a store of objects named by keys, the same on local disk and on S3.

A key is a relative POSIX name (`manifests/<fingerprint>.json`) under the store's root directory or bucket prefix.
`check_key` is the one place keys are checked, so that none names anything outside the store. The public methods of
`ObjectStore` own the guards (the key, the read limit); a backend fills the `_`-prefixed hooks.

Small objects (manifests, aliases, leases) are read whole and bounded (`get(key, limit=...)`): an object larger than
the limit is refused before its bytes are read, and on local disk a symlink, a FIFO or a device is refused too. They
are written whole: `create` only if absent, `replace` only if the object is still the version the writer read (its
ETag). S3 has no rename, so these two conditional writes are what make publishing and leases safe between processes.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from factory.errors import ArtifactError

MAX_KEY_BYTES = 1024
"""S3's limit on a key's length (UTF-8), the store's prefix included."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
RESERVED = ".~"
"""No key segment starts with it: a backend's own files (the local one's temp, lock and sha256 files) do."""


@dataclass(frozen=True, slots=True)
class Blob:
    """A small object's bytes and the ETag of exactly that version."""

    data: bytes
    etag: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Stat:
    """What a store says of an object without reading it."""

    size: int
    etag: str
    """Changes whenever the object's bytes change; `replace` takes it."""
    sha256: str | None
    """The sha256 its writer recorded with it (`upload`), None when it recorded none. A claim, not a proof: only reading
    every byte proves it."""
    modified: float
    """When it was last written: POSIX seconds (the store's clock)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Listed:
    """What a listing says of each object: no object is read or asked about one by one."""

    etag: str
    size: int
    modified: float
    """When it was last written: POSIX seconds (the store's clock)."""


def check_key(key: str) -> str:
    """`key` if it is a valid key: relative, `/`-separated, no empty segment, no segment starting with `.` (`.` and `..`,
    and the local backend's temp and lock files), no NUL or other control character, at most `MAX_KEY_BYTES`."""
    problem = _key_problem(key)
    if problem:
        raise ArtifactError(f"{key!r} is not a valid object key: {problem}")
    return key


def check_prefix(prefix: str) -> str:
    """`prefix` if `list` may take it: empty (everything), or a key's beginning, `/`-terminated or not."""
    if prefix:
        check_key(prefix.removesuffix("/"))
    return prefix


def _key_problem(key: str) -> str:
    if not isinstance(key, str) or not key:
        return "empty"
    if key.startswith("/"):
        return "absolute (a key is relative to the store)"
    if _CONTROL.search(key):
        return "holds a NUL or another control character"
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        return f"longer than {MAX_KEY_BYTES} bytes"
    for segment in key.split("/"):
        if not segment:
            return "an empty segment (`//` or a trailing `/`)"
        if segment in (".", ".."):
            return f"segment {segment!r} (`..` would leave the store)"
        if segment.startswith(RESERVED):
            return f"segment {segment!r} starts with `{RESERVED}`, which names the store's own files"
    return ""


class ObjectStore(ABC):
    """Objects by key under one root (`uri`). Public methods check their arguments, then call the backend's hooks."""

    uri: str
    """Where the objects are: `file:///abs/dir`, `s3://bucket/prefix`."""

    def get(self, key: str, *, limit: int) -> Blob | None:
        """The object's bytes and ETag; None when absent. An object larger than `limit` bytes is refused unread."""
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        blob = self._get(check_key(key), limit)
        assert blob is None or len(blob.data) <= limit, f"{self._hook_name('_get')} read past the limit"
        return blob

    def stat(self, key: str) -> Stat | None:
        """Size, ETag and recorded sha256 of an object, without reading it; None when absent."""
        return self._stat(check_key(key))

    def create(self, key: str, data: bytes) -> str | None:
        """Write the object only if no object has the key: its ETag, or None when one already existed (left as it was)."""
        return self._create(check_key(key), bytes(data))

    def replace(self, key: str, data: bytes, etag: str) -> str | None:
        """Write the object only if it is still the version `etag` names: the new ETag, or None when it has changed or
        is gone (the write lost, nothing was written)."""
        return self._replace(check_key(key), bytes(data), etag)

    def put(self, key: str, data: bytes) -> str:
        """Write the object whatever is there: its ETag."""
        return self._put(check_key(key), bytes(data))

    def upload(self, key: str, path: Path, *, sha256: str) -> str:
        """Stream a local regular file into the object (whatever is there), recording `sha256` (the file's, which the
        caller computed) with it: its ETag."""
        if not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise ValueError(f"sha256 must be 64 lowercase hex digits, got {sha256!r}")
        return self._upload(check_key(key), Path(path), sha256)

    def download(self, key: str, path: Path) -> None:
        """Stream the object into the local file `path`, which appears whole or not at all (temp file, then rename).
        Raises ArtifactError when the object is absent."""
        self._download(check_key(key), Path(path))

    def open_read(self, key: str) -> BinaryIO:
        """The object as a binary file to read and seek (torch.load and pyarrow take it). Raises ArtifactError when the
        object is absent."""
        return self._open_read(check_key(key))

    def list(self, prefix: str = "") -> list[str]:
        """The keys that start with `prefix`, sorted."""
        return sorted(self._list(check_prefix(prefix)))

    def versions(self, prefix: str = "") -> dict[str, str]:
        """The keys that start with `prefix`, sorted, each with its ETag: from the listing alone, no object read."""
        return {key: listed.etag for key, listed in self.listing(prefix).items()}

    def listing(self, prefix: str = "") -> dict[str, Listed]:
        """The keys that start with `prefix`, sorted, each with its ETag, size and last change: from the listing alone."""
        return dict(sorted(self._list(check_prefix(prefix)).items()))

    def delete(self, key: str) -> None:
        """Remove the object; nothing happens when it is absent."""
        self._delete(check_key(key))

    @classmethod
    def table_properties(cls, uri: str) -> dict[str, str]:
        """What pyiceberg's file IO needs to read and write tables under `uri` (a warehouse in a store of this kind):
        endpoint, credentials and retries, from the environment. None needed by default (a local directory)."""
        return {}

    def missing(self, key: str) -> ArtifactError:
        """The error for an object that must exist and does not."""
        return ArtifactError(f"{self.uri}/{key}: no such object")

    def _hook_name(self, name: str) -> str:
        return f"{type(self).__name__}.{name}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"

    @abstractmethod
    def _get(self, key: str, limit: int) -> Blob | None: ...

    @abstractmethod
    def _stat(self, key: str) -> Stat | None: ...

    @abstractmethod
    def _create(self, key: str, data: bytes) -> str | None: ...

    @abstractmethod
    def _replace(self, key: str, data: bytes, etag: str) -> str | None: ...

    @abstractmethod
    def _put(self, key: str, data: bytes) -> str: ...

    @abstractmethod
    def _upload(self, key: str, path: Path, sha256: str) -> str: ...

    @abstractmethod
    def _download(self, key: str, path: Path) -> None: ...

    @abstractmethod
    def _open_read(self, key: str) -> BinaryIO: ...

    @abstractmethod
    def _list(self, prefix: str) -> dict[str, Listed]:
        """Key -> what the listing says of it, for every object whose key starts with `prefix`."""

    @abstractmethod
    def _delete(self, key: str) -> None: ...


def too_large(where: str, size: int, limit: int) -> ArtifactError:
    """The error for an object larger than a bounded read allows."""
    return ArtifactError(f"{where}: {size} bytes, more than the {limit} this read takes: refused unread")
