"""The files of one artifact directory: hashing, finding damage, and changing modes without ever following a link.

A published artifact holds regular files and directories only. A symlink (even to identical
bytes) or any other kind of entry is damage: its bytes can change outside the registry, and
changing its mode would change a file that is not ours.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from factory.bounded import read_regular
from factory.errors import ArtifactError

CHUNK_BYTES = 1 << 20
RECORD_BYTES = 16 << 20
"""The largest registry record read (a manifest, a lease, a promotion, the stamps): a manifest listing thousands of files
is a few MiB."""
DIGEST = re.compile(r"^[0-9a-f]{64}$")
"""An artifact's digest (the sha256 of its file listing): the name of its directory."""
NAME = re.compile(r"^[0-9A-Za-z][0-9A-Za-z_.-]{0,127}$")
"""A fingerprint, a ref: one path component of the registry, never `..` nor hidden."""


def read_record(path: Path, max_bytes: int = RECORD_BYTES) -> bytes:
    """The bytes of a small registry file: a regular file of at most `max_bytes`, opened without following a link and
    without blocking (a FIFO, a device or a link to /dev/zero is refused at once, never read). FileNotFoundError when
    there is none; another OSError saying what is there instead."""
    return read_regular(path, max_bytes, follow_links=False)


def load_record(path: Path, max_bytes: int = RECORD_BYTES) -> Any:
    """A small registry file parsed as JSON (`read_record`): ValueError when it is not JSON the factory could have
    written (nested past what the parser follows, an integer of thousands of digits)."""
    text = read_record(path, max_bytes)
    try:
        return json.loads(text)
    except RecursionError as e:
        raise ValueError("JSON nested too deeply") from e


def entries(base: Path) -> tuple[dict[str, os.stat_result], list[str]]:
    """The regular files under `base` (relative POSIX names -> lstat), and the names of what is neither a regular
    file nor a directory (symlinks, fifos, sockets, devices). Links are never followed."""
    files: dict[str, os.stat_result] = {}
    odd: list[str] = []
    for top, dirs, names in os.walk(base, followlinks=False):
        for name in [*dirs, *names]:
            path = os.path.join(top, name)
            info = os.lstat(path)
            relative = Path(path).relative_to(base).as_posix()
            if stat.S_ISREG(info.st_mode):
                files[relative] = info
            elif not stat.S_ISDIR(info.st_mode):
                odd.append(relative)
    return files, sorted(odd)


def structural_damage(base: Path, expected: Mapping[str, Mapping[str, Any]]) -> tuple[list[str], dict[str, os.stat_result]]:
    """What is wrong with the layout of `base` against a manifest's file listing, without reading any bytes
    (missing files, wrong sizes, symlinks and other non-regular entries, extra files); and the lstat of each file."""
    try:
        info = os.lstat(base)
    except FileNotFoundError:
        return [f"{base.name}: directory missing"], {}
    if not stat.S_ISDIR(info.st_mode):
        return [f"{base.name}: not a directory (a symlink or a file)"], {}
    found, odd = entries(base)
    problems = [f"{name}: symlink or not a regular file" for name in odd]
    for name, entry in sorted(expected.items()):
        if name in odd:
            continue
        if name not in found:
            problems.append(f"{name}: missing")
        elif found[name].st_size != entry["bytes"]:
            problems.append(f"{name}: {found[name].st_size} bytes, manifest says {entry['bytes']}")
    problems.extend(f"{name}: extra file, not in the manifest" for name in sorted(found.keys() - expected.keys()))
    return problems, found


def hash_files(root: Path) -> dict[str, dict[str, Any]]:
    """sha256 and size of every regular file under `root` (fsynced as it is read)."""
    found, odd = entries(root)
    if odd:
        raise ArtifactError(f"{root} holds symlinks or special files ({', '.join(odd)}); a stage must write regular files only")
    return {name: {"sha256": sha256_file(root / name, fsync=True), "bytes": found[name].st_size} for name in sorted(found)}


def sha256_file(path: Path, *, fsync: bool = False) -> str:
    """The sha256 of a regular file's bytes (refusing to follow a symlink at the last component)."""
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
        if fsync:
            os.fsync(f.fileno())
    return digest.hexdigest()


def make_writable(root: Path) -> None:
    """Let the owner write `root` and the directories and regular files in it; links are left alone (never their targets)."""
    if not stat.S_ISDIR(os.lstat(root).st_mode):
        return  # a link (or a file) where a directory should be: nothing in it is ours
    for path in [root, *_walk(root)]:
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode):
            os.chmod(path, info.st_mode | stat.S_IWUSR)  # a directory or regular file by lstat: nothing is followed


def make_read_only(root: Path) -> None:
    """Make `root` and everything in it read-only (directories stay listable); links are left alone."""
    read_only = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
    searchable = stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
    for path in [*sorted(_walk(root), reverse=True), root]:
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode):
            os.chmod(path, read_only | searchable)
        elif stat.S_ISREG(info.st_mode):
            os.chmod(path, read_only)


def _walk(root: Path) -> list[Path]:
    found = []
    for top, dirs, names in os.walk(root, followlinks=False):
        found.extend(Path(top) / name for name in [*dirs, *names])
    return found
