"""Files that are whole or absent: written to a temp file beside their place, fsynced, then renamed or linked in.

A crash leaves the old file or the new one, never a torn one; at worst a stray temp file named
`.<name>.<random>.tmp` stays behind, which no reader of `<name>` looks at.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

TEMP_SUFFIX = ".tmp"


def write_atomic(path: Path, data: bytes | str, *, mode: int = 0o666) -> None:
    """Replace `path` with `data` (str as UTF-8): temp file, fsync, rename, fsync of the directory."""
    with synced_temp(path, data, mode=mode) as tmp:
        os.replace(tmp, path)
    fsync_directory(path.parent)


@contextlib.contextmanager
def synced_temp(path: Path, data: bytes | str, *, mode: int = 0o666) -> Iterator[Path]:
    """A new temp file beside `path` holding `data`, fsynced, for the caller to rename or link into place.

    `mode` is given to `os.open` (so the umask applies, as with `open`); the temp file is removed on exit
    unless it was renamed away.
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}{TEMP_SUFFIX}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def fsync_directory(path: Path) -> None:
    """Make the renames, links and removals in directory `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
