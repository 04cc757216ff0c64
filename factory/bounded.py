"""Reading a file that may be hostile: a regular file only, opened without blocking, read up to a cap.

A path may name a FIFO (opening it to read would wait for a writer), a device (/dev/zero never ends), a directory or a
link to any of them. Each is refused before a byte is read, and a regular file is read to at most its cap (a file can
grow while it is read).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

KINDS = {stat.S_IFDIR: "a directory", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
         stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symlink"}


class NotRegular(OSError):
    """The path names something other than a regular file; the message says what."""


class TooLarge(OSError):
    """The file holds more bytes than the reader's cap."""


def kind_of(mode: int) -> str:
    """`a FIFO`, `a directory`, ...: what a non-regular file is, for a message."""
    return KINDS.get(stat.S_IFMT(mode), "not a regular file")


def read_regular(path: Path, max_bytes: int, *, follow_links: bool) -> bytes:
    """The bytes of the regular file at `path`, at most `max_bytes` of them. FileNotFoundError when there is none,
    NotRegular for anything else there (a link too, unless `follow_links`), TooLarge past the cap, OSError otherwise."""
    info = os.stat(path) if follow_links else os.lstat(path)
    if not stat.S_ISREG(info.st_mode):
        raise NotRegular(f"is {kind_of(info.st_mode)}, not a regular file")
    if info.st_size > max_bytes:
        raise TooLarge(f"{info.st_size} bytes, more than the limit of {max_bytes}")
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced between the stat and the open
            raise NotRegular("is not a regular file")
        chunks, size = [], 0
        while size <= max_bytes and (chunk := os.read(fd, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > max_bytes:
        raise TooLarge(f"more than the limit of {max_bytes} bytes")
    return b"".join(chunks)
