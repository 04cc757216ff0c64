"""How a stage process ends: Ctrl-C or SIGTERM unwind it in order, and its error is said once, in one line.

Unwinding runs every `finally` on the way out: the lease is released (no `factory plan` waits on a
stage that is gone), the staging directory removed, the tracker run marked failed. The error goes to
the file the local launcher names (`ERROR_FILE_ENV`), which reports it as the stage's failure;
a stage started any other way prints it on stderr.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import FrameType

from factory.atomic import write_atomic
from factory.launch.local import ERROR_FILE_ENV

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def stop_on_signals() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt, once: a repeat while the stage unwinds is ignored."""
    for number in STOP_SIGNALS:
        signal.signal(number, _interrupt)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    for number in STOP_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    raise KeyboardInterrupt


def say_error(message: str) -> None:
    """The stage's failure in one line: into the launcher's error file when it named one, else on stderr."""
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        print(f"error: {message}", file=sys.stderr)
        return
    write_atomic(Path(path), message + "\n")
