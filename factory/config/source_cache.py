"""The bounded cache of directories that source kinds materialise: a commit unpacked, an archive extracted.

`source_cache(kind, key, fill)` returns `<FACTORY_CACHE>/source-trees/<kind>/<key>`, filled by `fill` the first time.
A fill writes into a temporary directory renamed into place, so no reader sees half of one, and holds the key's lock
(`.<key>.lock`), so callers racing on one key wait for the first and end with its one copy. Every use touches the
directory's mtime; once a fill makes the cache hold more than `FACTORY_SOURCE_CACHE_GB`, the least recently used
entries are removed, except those used in the last `IN_USE_GRACE_S` (a raw stage may still be reading one) and those
whose lock is held (being filled). A key names one content forever (a full commit sha, a digest): what is cached is
never refreshed.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from factory.errors import number_setting

CACHE_ENV = "FACTORY_CACHE"
"""The factory's cache directory (default `$XDG_CACHE_HOME/model-factory`, else `~/.cache/model-factory`)."""
BOUND_ENV = "FACTORY_SOURCE_CACHE_GB"
BOUND_GB = 20.0
"""How much the cached source directories may hold together (`$FACTORY_SOURCE_CACHE_GB`)."""
IN_USE_GRACE_S = 3600.0
"""An entry used more recently than this is in use: never removed to make room."""
TREES = "source-trees"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""What a kind name or a key may be: one path segment, not hidden."""
PENDING = re.compile(r"\.(?:fill|evicted)-(?P<key>.+)-[^-]+")
"""A fill in progress (or cut short), or an entry being removed: `.fill-<key>-<random>`, `.evicted-<key>-<random>`."""


def cache_home() -> Path:
    """The factory's cache directory: `$FACTORY_CACHE`, else `$XDG_CACHE_HOME/model-factory`, else `~/.cache/model-factory`."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(os.environ.get(CACHE_ENV) or Path(base) / "model-factory")


def source_cache(kind: str, key: str, fill: Callable[[Path], None]) -> Path:
    """The cached directory of `key` for the source kind `kind`: made by `fill(directory)` (which writes the files into
    the empty `directory` it is given) the first time, then reused; the least recently used others are removed to keep
    the cache within its bound."""
    bound = _bound_bytes()
    kinds = cache_home() / TREES
    base = kinds / _segment(kind, "kind name")
    target = base / _segment(key, "key")
    base.mkdir(parents=True, exist_ok=True)
    with _locked(base, key, wait=True):
        if target.is_dir():
            os.utime(target)  # used now: the last a full cache gives up
            return target
        scratch = Path(tempfile.mkdtemp(prefix=f".fill-{key}-", dir=base))
        try:
            fill(scratch)
            try:
                scratch.rename(target)
            except OSError:
                if not target.is_dir():  # else another process filled it meanwhile (a file system whose locks do not hold)
                    raise
            os.utime(target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)  # a fill that failed or lost; gone already when renamed
    _evict(kinds, bound, keep=target)
    return target


def _bound_bytes() -> float:
    """The cache's bound in bytes, from `$FACTORY_SOURCE_CACHE_GB` (default `BOUND_GB`); a ConfigError naming it when it is
    not a number of GB."""
    return number_setting(BOUND_ENV, os.environ.get(BOUND_ENV), default=BOUND_GB, low=0, high=math.inf,
                          says=f"give the bound of the cached source directories in GB, a number such as {BOUND_GB:g} (or unset it)") * (1 << 30)


def _segment(name: str, what: str) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"source_cache: {what} {name!r}: use letters, digits, '.', '_', '-' (at most 128, not starting with '.')")
    return name


@contextlib.contextmanager
def _locked(base: Path, key: str, wait: bool) -> Iterator[bool]:
    """Hold the lock of `key` (yields True), or, when not `wait`ing and another process holds it, yield False. The lock
    file may be removed by an eviction: a lock taken on a file no longer at its path is taken again."""
    path = base / f".{key}.lock"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            try:
                current = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if current:
                yield True
                return
        finally:
            os.close(fd)


def _evict(kinds: Path, bound: float, keep: Path) -> None:
    """Remove the least recently used entries while the cache holds more than `bound` bytes; never `keep`, an entry used
    in the last `IN_USE_GRACE_S` nor one whose lock is held."""
    found = []
    for path in (path for base in kinds.iterdir() if base.is_dir() for path in base.iterdir()):
        with contextlib.suppress(FileNotFoundError):  # removed by another process meanwhile
            if path.is_dir():
                found.append((path.stat().st_mtime, _size(path), path))
    total = sum(size for _, size, _ in found)
    for _, size, path in sorted(found):
        if total <= bound:
            break
        if path != keep and _remove_unused(path):
            total -= size


def _remove_unused(path: Path) -> bool:
    """Remove an entry (or a fill cut short) unless it is in use; whether it was removed."""
    key = m.group("key") if (m := PENDING.fullmatch(path.name)) else path.name
    with _locked(path.parent, key, wait=False) as held:
        try:
            if not held or time.time() - path.stat().st_mtime <= IN_USE_GRACE_S:
                return False
            trash = Path(tempfile.mkdtemp(prefix=f".evicted-{key}-", dir=path.parent))
            path.rename(trash / path.name)  # gone from its place at once; its files are removed below
        except FileNotFoundError:  # removed by another process meanwhile
            return False
        if not PENDING.fullmatch(path.name):
            (path.parent / f".{key}.lock").unlink(missing_ok=True)
    shutil.rmtree(trash, ignore_errors=True)
    return True


def _size(path: Path) -> int:
    """The bytes of the files under `path` (links counted as themselves)."""
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total
