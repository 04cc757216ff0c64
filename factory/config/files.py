"""Which files a config may make the factory read, and reading them within bounds.

Experiment files come from pull requests and run unattended: a path in one (`extends:`, a
directory source) must not open a device, a FIFO, a socket or a file of /proc or /sys, nor
anything outside the trees the factory works on. Symlinks are resolved before the under-root
test, the file is stat'ed before it is opened, and it is opened non-blocking and read up to a cap.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from factory.errors import ConfigError

MAX_FILE_BYTES = 1 << 20
"""The largest experiment file read (a recipe is a few KiB)."""
DATA_ROOTS_ENV = "FACTORY_DATA_ROOTS"
"""os.pathsep-separated directories directory sources may read under (over `data_roots` of the settings file,
`factory.config.settings`; default: the repository only)."""
SYSTEM_TREES = (Path("/proc"), Path("/sys"), Path("/dev"))
KINDS = {stat.S_IFDIR: "a directory", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
         stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket"}


def repository_root(directory: Path) -> Path:
    """The git toplevel holding `directory` (the nearest parent with a `.git`), or `directory` itself when none does."""
    start = directory.resolve()
    for candidate in (start, *start.parents):
        if (candidate / ".git").exists():
            return candidate
    return start


def outside_roots(path: Path, roots: tuple[Path, ...]) -> str | None:
    """Why `path` (symlinks resolved) may not be read under `roots`, or None when it may."""
    resolved = path.resolve()
    if any(resolved == tree or resolved.is_relative_to(tree) for tree in SYSTEM_TREES):
        return f"{resolved} is in {resolved.parts[0]}{resolved.parts[1]}, which holds no data to read"
    if not any(resolved.is_relative_to(root) for root in roots):
        shown = os.pathsep.join(str(root) for root in roots)
        return (f"{resolved} is outside the directories the factory reads ({shown}; name another in data_roots of "
                f"factory.toml, or {DATA_ROOTS_ENV})")
    return None


def kind_of(mode: int) -> str:
    """`a FIFO`, `a directory`, ...: what a non-regular file is, for a message."""
    return KINDS.get(stat.S_IFMT(mode), "not a regular file")


def read_bounded(path: Path, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most `max_bytes`; a ConfigError (never a hang) for anything else."""
    try:
        info = os.stat(path)
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: no such experiment file") from e
    except (OSError, ValueError) as e:  # ValueError: a path no file system accepts
        raise ConfigError(f"{path}: cannot read the file ({e})") from e
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{path}: is {kind_of(info.st_mode)}, not a regular file; name an experiment file")
    if info.st_size > max_bytes:
        raise ConfigError(f"{path}: {info.st_size} bytes, more than the limit of {max_bytes}; an experiment file is a short recipe")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the file ({e})") from e
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced between the stat and the open
            raise ConfigError(f"{path}: is not a regular file; name an experiment file")
        chunks, size = [], 0
        while size <= max_bytes and (chunk := os.read(fd, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the file ({e})") from e
    finally:
        os.close(fd)
    if size > max_bytes:
        raise ConfigError(f"{path}: more than the limit of {max_bytes} bytes; an experiment file is a short recipe")
    return b"".join(chunks)


def read_text(path: Path, max_bytes: int = MAX_FILE_BYTES) -> str:
    """`read_bounded`, decoded as UTF-8."""
    try:
        return read_bounded(path, max_bytes).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: cannot read the file as UTF-8 text ({e})") from e
