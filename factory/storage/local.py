"""The store on local disk: a key is a file under the root, reached without ever following a link.

Every path is opened segment by segment from the root with O_NOFOLLOW (`_parent`), so neither a key nor a symlinked
directory inside the root can lead outside it; a read opens regular files only (lstat first, so a device is never
opened; O_NONBLOCK, so a FIFO swapped in never blocks; fstat after) and bounds what it reads.

Writes go to a temp file beside the key (`.~<name>.<random>.tmp`: no key segment starts with `.~`), fsynced, then:
`create` links it in (a link never replaces), the others rename it over the key under an flock of `.~<name>.lock`, so
that `replace` compares and swaps atomically. Objects are read-only files: a version is never changed in place.

The ETag is a stat token: mtime_ns, ctime_ns, inode and size. Each write sets its file's mtime to the nanosecond
clock (under the lock, past the version it replaces), so two versions never share one; ctime cannot be set back, so a
change made in place and hidden by restoring mtime changes it too. (A reader that opens a created object in the
microseconds between its link and the removal of its temp name sees an earlier ctime: its `replace` then loses once
and reads again, as after any lost race.) `upload`'s sha256 is kept in `.~<name>.sha256` with the ETag it belongs to:
a later version makes it stale, and a stale one is ignored.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

from factory.errors import ArtifactError, ConfigError
from factory.storage.base import RESERVED, Blob, Listed, ObjectStore, Stat, too_large

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_OBJECT_MODE = 0o444
_SIDECAR_BYTES = 256
_COPY_BYTES = 1 << 24


class LocalStore(ObjectStore):
    """Objects as files under a local directory (created on the first write)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self.uri = self.root.as_uri()

    @classmethod
    def from_uri(cls, uri: str, setting: str, patient: bool = False) -> LocalStore:
        """`file:///abs/dir` (or `file://localhost/abs/dir`); a directory is never waited for (`patient` is S3's)."""
        parts = urlsplit(uri)
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/") or parts.query or parts.fragment:
            raise ConfigError(f"{setting}={uri}: a file URI names an absolute local directory, as file:///abs/dir")
        return cls(unquote(parts.path))

    def _get(self, key: str, limit: int) -> Blob | None:
        with self._parent(key) as (parent, name):
            fd = self._open_regular(parent, name, key) if parent is not None else None
            if fd is None:
                return None
            with os.fdopen(fd, "rb") as f:
                info = os.fstat(f.fileno())
                if info.st_size > limit:
                    raise too_large(self._where(key), info.st_size, limit)
                data = f.read(limit + 1)
        if len(data) > limit:  # it grew since fstat
            raise too_large(self._where(key), len(data), limit)
        return Blob(data, _etag(info))

    def _stat(self, key: str) -> Stat | None:
        with self._parent(key) as (parent, name):
            info = self._lstat_regular(parent, name, key) if parent is not None else None
            if info is None:
                return None
            etag = _etag(info)
            return Stat(size=info.st_size, etag=etag, sha256=self._recorded_sha256(parent, name, etag), modified=info.st_mtime)

    def _create(self, key: str, data: bytes) -> str | None:
        with self._parent(key, create=True) as (parent, name), _temp(parent, name, _writer(data)) as (temp, fd):
            _set_mtime(fd, time.time_ns())
            try:
                os.link(temp, name, src_dir_fd=parent, dst_dir_fd=parent, follow_symlinks=False)
            except FileExistsError:
                return None
            os.unlink(temp, dir_fd=parent)  # before the fstat: removing a name changes the ctime
            os.fsync(parent)
            return _etag(os.fstat(fd))

    def _replace(self, key: str, data: bytes, etag: str) -> str | None:
        return self._write(key, _writer(data), expected=etag)

    def _put(self, key: str, data: bytes) -> str:
        return self._write(key, _writer(data))

    def _upload(self, key: str, path: Path, sha256: str) -> str:
        try:
            source = os.open(path, _READ)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise ArtifactError(f"{path}: a symlink: only a regular file can be uploaded") from e
            raise
        try:
            if not stat.S_ISREG(os.fstat(source).st_mode):
                raise ArtifactError(f"{path}: not a regular file: only a regular file can be uploaded")
            return self._write(key, lambda out: _copy(source, out), sha256=sha256)
        finally:
            os.close(source)

    def _download(self, key: str, path: Path) -> None:
        with self._open_read(key) as source:
            write_file_atomically(path, lambda out: _copy(source.fileno(), out))

    def _open_read(self, key: str) -> BinaryIO:
        with self._parent(key) as (parent, name):
            fd = self._open_regular(parent, name, key) if parent is not None else None
        if fd is None:
            raise self.missing(key)
        return os.fdopen(fd, "rb")

    def _list(self, prefix: str) -> dict[str, Listed]:
        directory = prefix.rpartition("/")[0]
        keys = {}
        with self._directory(directory.split("/") if directory else [], prefix) as parent:
            if parent is None:
                return {}
            for top, dirs, names, top_fd in os.fwalk(".", dir_fd=parent, follow_symlinks=False):
                dirs[:] = [name for name in dirs if not name.startswith(RESERVED)]
                base = os.path.normpath(os.path.join(directory, top))
                for name in names:
                    key = name if base == "." else f"{base}/{name}"
                    if not name.startswith(RESERVED) and key.startswith(prefix):
                        info = _lstat(top_fd, name)
                        if info is not None and stat.S_ISREG(info.st_mode):
                            keys[key] = Listed(etag=_etag(info), size=info.st_size, modified=info.st_mtime)
        return keys

    def _delete(self, key: str) -> None:
        with self._parent(key) as (parent, name):
            if parent is None:
                return
            with _locked(parent, name):
                for entry in (name, _sidecar(name)):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry, dir_fd=parent)
                os.fsync(parent)

    def _write(self, key: str, fill: Callable[[int], None], *, expected: str | None = None, sha256: str | None = None) -> str | None:
        """Write a new version through a temp file and rename it over the key under its lock; only over version
        `expected` when given (None when the key holds another version, or none)."""
        with self._parent(key, create=True) as (parent, name), _temp(parent, name, fill) as (temp, fd), _locked(parent, name):
            current = _lstat(parent, name)
            if expected is not None and (current is None or not stat.S_ISREG(current.st_mode) or _etag(current) != expected):
                return None
            _set_mtime(fd, max(time.time_ns(), current.st_mtime_ns + 1 if current else 0))
            os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
            etag = _etag(os.fstat(fd))
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_sidecar(name), dir_fd=parent)
            if sha256 is not None:
                with _temp(parent, _sidecar(name), _writer(f"{etag} {sha256}\n".encode())) as (sidecar_temp, _):
                    os.rename(sidecar_temp, _sidecar(name), src_dir_fd=parent, dst_dir_fd=parent)
            os.fsync(parent)
            return etag

    @contextlib.contextmanager
    def _parent(self, key: str, *, create: bool = False) -> Iterator[tuple[int, str] | tuple[None, str]]:
        """An fd of the directory that holds `key` and the key's last segment; (None, name) when a directory on the way
        does not exist (made, when `create`)."""
        *directories, name = key.split("/")
        with self._directory(directories, key, create=create) as fd:
            yield fd, name

    @contextlib.contextmanager
    def _directory(self, segments: list[str], key: str, *, create: bool = False) -> Iterator[int | None]:
        """An fd of the directory `segments` under the root, each opened without following a link; None when one does
        not exist (made, when `create`). `key` names what it is for, in errors."""
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.root, _DIRECTORY)
        except FileNotFoundError:
            yield None
            return
        try:
            for segment in segments:
                try:
                    child = os.open(segment, _DIRECTORY, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        yield None
                        return
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(segment, dir_fd=fd)
                    child = os.open(segment, _DIRECTORY, dir_fd=fd)
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise ArtifactError(f"{self._where(key)}: {segment} is a symlink or not a directory: refused") from e
                    raise
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    def _open_regular(self, parent: int, name: str, key: str) -> int | None:
        """An fd of the regular file `name` in `parent`, or None when absent; anything else is refused unopened."""
        if self._lstat_regular(parent, name, key) is None:
            return None
        try:
            fd = os.open(name, _READ, dir_fd=parent)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise ArtifactError(f"{self._where(key)}: a symlink, not a regular file: refused") from e
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the lstat
            os.close(fd)
            raise ArtifactError(f"{self._where(key)}: not a regular file: refused")
        return fd

    def _lstat_regular(self, parent: int, name: str, key: str) -> os.stat_result | None:
        info = _lstat(parent, name)
        if info is not None and not stat.S_ISREG(info.st_mode):
            raise ArtifactError(f"{self._where(key)}: {_kind(info.st_mode)}, not a regular file: refused")
        return info

    def _recorded_sha256(self, parent: int, name: str, etag: str) -> str | None:
        """The sha256 `upload` recorded for version `etag`; None when it recorded none for this version."""
        info = _lstat(parent, _sidecar(name))
        if info is None or not stat.S_ISREG(info.st_mode) or info.st_size > _SIDECAR_BYTES:
            return None
        fd = os.open(_sidecar(name), _READ, dir_fd=parent)
        with os.fdopen(fd, "rb") as f:
            recorded_etag, _, sha256 = f.read(_SIDECAR_BYTES).decode("ascii", "replace").strip().partition(" ")
        return sha256 if recorded_etag == etag and len(sha256) == 64 else None

    def _where(self, key: str) -> str:
        return str(self.root / key)


def _etag(info: os.stat_result) -> str:
    return f"{info.st_mtime_ns:x}-{info.st_ctime_ns:x}-{info.st_ino:x}-{info.st_size:x}"


def _lstat(parent: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _kind(mode: int) -> str:
    kinds = {stat.S_ISLNK: "a symlink", stat.S_ISDIR: "a directory", stat.S_ISFIFO: "a FIFO", stat.S_ISCHR: "a device",
             stat.S_ISBLK: "a device", stat.S_ISSOCK: "a socket"}
    return next((kind for test, kind in kinds.items() if test(mode)), "a special file")


def _sidecar(name: str) -> str:
    return f"{RESERVED}{name}.sha256"


def _set_mtime(fd: int, ns: int) -> None:
    os.utime(fd, ns=(ns, ns))


def write_all(fd: int, data) -> None:
    """Write all of `data` (anything with the buffer protocol) to `fd`."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _writer(data: bytes) -> Callable[[int], None]:
    return lambda fd: write_all(fd, data)


def _copy(source: int, out: int) -> None:
    """Copy the rest of file `source` into `out` (in the kernel)."""
    while os.sendfile(out, source, None, _COPY_BYTES):
        pass


@contextlib.contextmanager
def _temp(parent: int, name: str, fill: Callable[[int], None]) -> Iterator[tuple[str, int]]:
    """A new read-only temp file beside `name`, filled and fsynced: its name and an fd open for writing. Removed on
    exit unless it was renamed or linked in and removed by the caller."""
    temp = f"{RESERVED}{name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, _OBJECT_MODE, dir_fd=parent)
    try:
        fill(fd)
        os.fsync(fd)
        yield temp, fd
    finally:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=parent)


@contextlib.contextmanager
def _locked(parent: int, name: str) -> Iterator[None]:
    """An exclusive flock of `.~<name>.lock` beside `name` (the lock file stays: removing it would race its users)."""
    fd = os.open(f"{RESERVED}{name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=parent)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write_file_atomically(path: Path, fill: Callable[[int], None]) -> None:
    """Make local file `path` hold what `fill` writes, whole or not at all: temp file beside it, fsync, rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with _temp(parent, path.name, fill) as (temp, fd):
            os.fchmod(fd, 0o644)
            os.rename(temp, path.name, src_dir_fd=parent, dst_dir_fd=parent)
        os.fsync(parent)
    finally:
        os.close(parent)
