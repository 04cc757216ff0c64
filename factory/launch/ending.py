"""Ending a process of the factory at once (`exit_now`), after telling its exit code to whoever waits for it there.

A stage forked from a warm interpreter (`factory.launch.warm_server`) is not its launcher's child: the server reports its
exit, but only between two imports (a second or two, while it imports torch). The child also writes its code on a pipe
the launcher reads (`tell_exit_on`), as it ends.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys

_told: tuple[int, int] | None = None
"""The descriptor to write the exit code on, and the process that is to write it (a process forked from it, a rank or a
data loader's worker, which has the descriptor too, writes nothing)."""


def tell_exit_on(fd: int | None) -> None:
    """Write this process's exit code on `fd` as `end` ends it (None: nowhere)."""
    global _told
    _told = None if fd is None else (fd, os.getpid())


def exit_now(code: int) -> None:
    """End a stage process (or an orchestrating one) without tearing the interpreter down: what it made is published
    and fsynced, so only exit handlers and buffered output matter, and unloading torch, pyarrow or Dagster module by
    module takes about a second."""
    atexit._run_exitfuncs()  # what a normal exit runs first (the tracker's and logging's handlers), then no module teardown
    sys.stdout.flush()
    sys.stderr.flush()
    end(code)


def end(code: int) -> None:
    """`os._exit(code)`, once the exit status it makes (the code modulo 256) is written where `tell_exit_on` said."""
    if _told is not None and _told[1] == os.getpid():
        with contextlib.suppress(OSError):  # the launcher went away: nobody to tell
            os.write(_told[0], f"{code & 0xFF}\n".encode())
    os._exit(code)
