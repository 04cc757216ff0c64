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
from typing import Any

from factory.atomic import write_atomic
from factory.launch.local import ERROR_FILE_ENV

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


_stopping = False
"""Whether a stop signal came and its KeyboardInterrupt is on its way out."""


def stop_on_signals() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt, once: a repeat while the stage unwinds is ignored. One that lands in a
    finalizer (a weakref callback or `__del__`, run by the garbage collector anywhere), where Python prints it and drops
    it, is raised again where the stage runs, so the stage still stops."""
    for number in STOP_SIGNALS:
        signal.signal(number, _interrupt)
    sys.unraisablehook = _redeliver


def _interrupt(signum: int, frame: FrameType | None) -> None:
    global _stopping
    if _within(frame, _redeliver.__code__):
        # Come while the hook that redelivers is still running (a loaded machine held it past the alarm): raised here, it
        # would be dropped for good (an error of the hook is not handed to the hook). Once more, after it returns.
        _raise_later()
        return
    if _stopping:
        return
    _stopping = True
    raise KeyboardInterrupt


def _within(frame: FrameType | None, code: Any) -> bool:
    """Whether the function of `code` is running: in `frame` or a frame that called it."""
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


REDELIVER_AFTER_S = 0.01
"""How long after a finalizer dropped the interrupt it is raised again: the finalizer has returned by then (one that has
not drops it again, and it comes back again)."""


def _redeliver(unraisable: Any) -> None:
    global _stopping
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _stopping:
        _stopping = False
        _raise_later()
        return
    sys.__unraisablehook__(unraisable)


def _raise_later() -> None:
    """The interrupt raised again in REDELIVER_AFTER_S, by a real signal: it also ends a sleep or a wait the stage is in."""
    signal.signal(signal.SIGALRM, _interrupt)
    signal.setitimer(signal.ITIMER_REAL, REDELIVER_AFTER_S)


def interrupted(error: BaseException) -> bool:
    """Whether `error` is the stop a signal asked for: its KeyboardInterrupt, or whatever a library raised in its place
    once the signal came (pydantic's serializer, for one, turns the interrupt into an error of its own)."""
    return isinstance(error, KeyboardInterrupt) or _stopping


def say_error(message: str) -> None:
    """The stage's failure in one line: into the launcher's error file when it named one, else on stderr."""
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        print(f"error: {message}", file=sys.stderr)
        return
    write_atomic(Path(path), message + "\n")
