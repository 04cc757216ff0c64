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

from factory.bounded import NotRegular, TooLarge, read_regular
from factory.errors import ConfigError

MAX_FILE_BYTES = 1 << 20
"""The largest experiment file read (a recipe is a few KiB)."""
DATA_ROOTS_ENV = "FACTORY_DATA_ROOTS"
"""os.pathsep-separated directories directory sources may read under (over `data_roots` of the settings file,
`factory.config.settings`; default: the repository only)."""
SYSTEM_TREES = (Path("/proc"), Path("/sys"), Path("/dev"))


def repository_root(directory: Path) -> Path:
    """The git toplevel holding `directory` (the nearest parent with a `.git`), or `directory` itself when none does (a
    file's directory, given a file: an experiment file outside any repository)."""
    start = directory.resolve()
    if start.is_file():
        start = start.parent
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


def read_bounded(path: Path, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most `max_bytes`; a ConfigError (never a hang) for anything else."""
    try:
        return read_regular(path, max_bytes, follow_links=True)
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: no such experiment file") from e
    except NotRegular as e:
        raise ConfigError(f"{path}: {e}; name an experiment file") from e
    except TooLarge as e:
        raise ConfigError(f"{path}: {e}; an experiment file is a short recipe") from e
    except (OSError, ValueError) as e:  # ValueError: a path no file system accepts
        raise ConfigError(f"{path}: cannot read the file ({e})") from e


def read_text(path: Path, max_bytes: int = MAX_FILE_BYTES) -> str:
    """`read_bounded`, decoded as UTF-8."""
    try:
        return read_bounded(path, max_bytes).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: cannot read the file as UTF-8 text ({e})") from e
