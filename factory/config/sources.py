"""What a source would read today: its root, the files its globs match, and their content hashes.

The raw stage's fingerprint holds the digest of this listing, so a file added, changed or removed
under a source makes the raw stage run again, and `factory plan` names the files. Hashing a tree
again on every plan would read the whole standard library: as git's index does, each file's
sha256 is kept with its size, mtime, ctime and inode (under `FACTORY_CACHE`, default
`~/.cache/model-factory`) and read again only when one of them changed, or when the file's mtime
is not older than the record ("racily clean": a write in the same clock tick would not show).

Glob patterns match the posix path relative to the source root: `*` stays within one directory,
`**/` spans any number of them (none included), so `**/*.py` matches `top.py` as well as
`pkg/sub/mod.py`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from factory.atomic import write_atomic
from factory.config.files import outside_roots
from factory.config.settings import data_roots
from factory.config.data_sections import SourceConfig
from factory.config.source_cache import cache_home
from factory.config.source_kinds import data_path_fields, selected_by, source_kind
from factory.errors import ConfigError

CACHE_DIRS = frozenset({"__pycache__"})
CHUNK_BYTES = 1 << 20
GLOB_CHARS = re.compile(r"[*?\[]")
SHOWN_FILES = 5
"""Changed files named per kind of change in a plan's reason; the rest are counted."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceFiles:
    """The files a source reads, by relative path: their sha256, or why they would be skipped unread."""

    root: str
    files: Mapping[str, str]
    digest: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "digest", listing_digest(self.files))


def source_problems(config: SourceConfig, roots: tuple[Path, ...]) -> list[tuple[tuple[str, ...], str]]:
    """Why the fields its kind adds make a source unreadable here, each with the key at fault under `source` (none: the
    section's): a `DataPath` outside `roots`, else what the kind's `check` says. Empty for a kind without fields."""
    kind = source_kind(config.kind)
    if kind.fields is None or config.fields is None:
        return []
    found = [((name,), f"{refused}; point it at data under them") for name in data_path_fields(kind.fields)
             if (refused := outside_roots(Path(getattr(config.fields, name)), roots))]
    if found:
        return found
    try:
        kind.checked(config.fields)
    except ConfigError as e:  # a PluginError too: said where the source is
        return [((), str(e))]
    return []


def source_root(config: SourceConfig) -> Path:
    """The directory a source reads from; a ConfigError when it is not a directory, or when its kind's fields are refused."""
    kind = source_kind(config.kind)
    if problems := source_problems(config, data_roots()):
        keys, problem = problems[0]
        raise ConfigError(f"{'.'.join(('source', *keys))}: {problem}")
    root = kind.root_of(config)
    if kind.takes_path and (refused := outside_roots(root, data_roots())):
        raise ConfigError(f"source.path: {refused}; point source.path at a directory of data")
    if not root.is_dir():
        found = "a file" if root.is_file() else "something that is not a directory" if root.exists() else "nothing"
        where = "source.path" if kind.takes_path else f"source.kind {config.kind!r} (no source.path)"
        raise ConfigError(
            f"{where}: expected a directory to read, found {found} at {root.resolve()}; "
            "point source.path at an existing directory (relative paths start at the working directory)"
        )
    return root


def _top_directories(patterns: tuple[str, ...]) -> frozenset[str] | None:
    """The first path segments every match must start with (`rich/**/*.py` -> rich), or None when a pattern can
    match at the top (no literal directory leads it): the walk then skips the other top-level directories."""
    tops = set()
    for pattern in patterns:
        first, slash, _ = pattern.partition("/")
        if not slash or GLOB_CHARS.search(first):
            return None
        tops.add(first)
    return frozenset(tops)


def matching_files(root: Path, config: SourceConfig) -> list[str]:
    """Relative posix paths of the files to read, sorted: included, not excluded, not in caches, and resolving under
    the data roots (a directory source) or under the root (a built-in one)."""
    kind = source_kind(config.kind)
    roots = data_roots() if kind.takes_path else (root.resolve(),)
    selected = selected_by(config)
    pruned = CACHE_DIRS | kind.skip_dirs
    tops = _top_directories(config.include)
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in pruned]
        base = Path(dirpath).relative_to(root).as_posix()
        if base == "." and tops is not None:
            dirnames[:] = [d for d in dirnames if d in tops]
        prefix = "" if base == "." else base + "/"
        for filename in filenames:
            rel = prefix + filename
            if selected(rel) and _inside(root / rel, roots):
                found.append(rel)
    return sorted(found)


def _inside(path: Path, roots: tuple[Path, ...]) -> bool:
    """Whether a listed file stays under `roots`: the walk follows no directory links, so only a symlinked file can
    leave them (to /proc/kmsg, /etc/shadow, ...). Other non-regular files stay listed, as `unreadable`, never opened."""
    try:
        return not stat.S_ISLNK(os.lstat(path).st_mode) or outside_roots(path, roots) is None
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop
        return False


def source_files(config: SourceConfig) -> SourceFiles:
    """Every file the source would read, with its sha256 (files too large or not regular are listed by why)."""
    root = source_root(config)
    return SourceFiles(root=str(root.resolve()), files=hashed_files(root, matching_files(root, config), config.max_file_bytes))


def hashed_files(root: Path, names: list[str], max_file_bytes: int | None = None) -> dict[str, str]:
    """{relative path: sha256} of `names` under `root`, from the stamps cache where a file is unchanged; a file that is not
    regular or cannot be read is `unreadable`, one over `max_file_bytes` `too_large:<size>`."""
    stamps_path = _stamps_path(root)
    known = _read_stamps(stamps_path)
    started_ns = time.time_ns()
    files: dict[str, str] = {}
    stamps: dict[str, list] = {}
    for rel in names:
        path = root / rel
        try:
            info = path.stat()
        except OSError:
            files[rel] = "unreadable"
            continue
        if not stat.S_ISREG(info.st_mode):
            files[rel] = "unreadable"
        elif max_file_bytes is not None and info.st_size > max_file_bytes:
            files[rel] = f"too_large:{info.st_size}"
        else:
            stamp = [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]
            record = known.get(rel)
            if record is not None and record[:4] == stamp and record[4] < started_ns and info.st_mtime_ns < record[4]:
                files[rel] = record[5]
                stamps[rel] = record
                continue
            digest = _sha256(path)
            files[rel] = digest or "unreadable"
            if digest:
                stamps[rel] = [*stamp, started_ns, digest]
    if stamps != known:
        _write_stamps(stamps_path, stamps)
    return files


def listing_digest(files: Mapping[str, str]) -> str:
    """The digest of a listing of {relative path: sha256}: what a fingerprint holds of a directory's files."""
    listing = "".join(f"{rel}\0{value}\n" for rel, value in sorted(files.items()))
    return hashlib.sha256(listing.encode()).hexdigest()[:32]


def changed_files(old: Mapping[str, str], new: Mapping[str, str]) -> str:
    """`2 files added (a.py, b.py), 1 changed (c.py)`: what differs between two listings, or '' when nothing does."""
    added = sorted(new.keys() - old.keys())
    removed = sorted(old.keys() - new.keys())
    changed = sorted(rel for rel in new.keys() & old.keys() if new[rel] != old[rel])
    parts = []
    for label, names in (("added", added), ("changed", changed), ("removed", removed)):
        if names:
            shown = ", ".join(names[:SHOWN_FILES]) + (f", … {len(names) - SHOWN_FILES} more" if len(names) > SHOWN_FILES else "")
            parts.append(f"{len(names)} {label} ({shown})")
    return ", ".join(parts)


def _sha256(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY), "rb") as f:  # a FIFO swapped in since the stat: no hang
            while chunk := f.read(CHUNK_BYTES):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def _stamps_path(root: Path) -> Path:
    return cache_home() / "sources" / (hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:24] + ".json")


def _read_stamps(path: Path) -> dict[str, list]:
    """The stamps last written for a root; a missing or damaged file is an empty cache (everything is hashed)."""
    try:
        stamps = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return stamps if isinstance(stamps, dict) else {}


def _write_stamps(path: Path, stamps: dict[str, list]) -> None:
    """Atomically; a cache that cannot be written only costs hashing again next time."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(stamps, separators=(",", ":")), mode=0o600)
