"""The embedded instance's compute logs: Dagster's local ones (the same files, read the same way by the UI), captured by
a thread of the run's process.

While a run goes on in a process, what the process and its children write to its stdout and stderr goes to the run's
log files and is copied from there to where the descriptors led before (the terminal of `factory run`), by a thread that
copies the rest once the run has ended. Dagster's own started `tail -F` and a watcher process per stream for every run
(four processes per run, and a wait of up to 30 s for a tail that did not end).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import IO, Any

from dagster._core.storage.compute_log_manager import CapturedLogContext, ComputeIOType
from dagster._core.storage.local_compute_log_manager import IO_TYPE_EXTENSION, LocalComputeLogManager
from dagster._serdes import ConfigurableClassData
from dagster._utils import ensure_file, touch_file

COPY_INTERVAL_S = 0.05
"""How often a captured stream's file is checked for more to copy while its run goes on."""
DRAIN_TIMEOUT_S = 30.0
"""How long the end of a capture waits for its copy to reach the terminal (one that does not read, say `| less` not paged
on): Dagster's bound on its tail."""


class FactoryComputeLogs(LocalComputeLogManager):
    """Dagster's local compute logs, captured without a process per stream."""

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value: Any) -> FactoryComputeLogs:
        return cls(inst_data=inst_data, **config_value)

    @contextlib.contextmanager
    def capture_logs(self, log_key: Sequence[str]) -> Iterator[CapturedLogContext]:
        out, err = (self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[kind]) for kind in (ComputeIOType.STDOUT, ComputeIOType.STDERR))
        with mirrored(sys.stdout, out), mirrored(sys.stderr, err):
            yield CapturedLogContext(log_key)
        touch_file(self.complete_artifact_path(log_key))  # as Dagster's: the capture is complete


@contextlib.contextmanager
def mirrored(stream: IO, path: str) -> Iterator[None]:
    """Within the block, what this process and its children write to `stream`'s file descriptor is appended to the file at
    `path`, and copied from there to where the descriptor led before, all of it by the block's end. A stream without a
    descriptor (a test's captured one) is left as it is."""
    ensure_file(path)
    try:
        descriptor = stream.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        yield
        return
    mirror = _Mirror(stream, descriptor, path)
    try:
        yield
    finally:
        mirror.end()


def end_mirrors() -> None:
    """End every capture this process has open, the innermost first: each descriptor given back and what its file holds
    copied to where it leads. For a process that leaves while a run goes on (`os._exit` in `assets.watch`, an exit
    handler), which would otherwise lose what the run printed last."""
    while True:
        with _lock:
            if not _open:
                return
            mirror = _open[-1]
        mirror.end()


class _Mirror:
    """`mirrored`'s work: started when made, ended once by `end`, from whichever thread comes first."""

    def __init__(self, stream: IO, descriptor: int, path: str) -> None:
        self.stream, self.descriptor = stream, descriptor
        self.stop = threading.Event()
        before, source = os.dup(descriptor), None
        try:
            source = os.open(path, os.O_RDONLY)
            stream.flush()
            sink = os.open(path, os.O_WRONLY | os.O_APPEND)
            try:
                os.dup2(sink, descriptor)
            finally:
                os.close(sink)
        except BaseException:
            for opened in (before, source):
                if opened is not None:
                    os.close(opened)
            raise
        self.before = before
        self.copier = threading.Thread(target=_copy, args=(source, before, self.stop), daemon=True, name=f"copy of {os.path.basename(path)}")
        with _lock:
            _open.append(self)
        self.copier.start()

    def end(self) -> None:
        with _lock:
            if self not in _open:
                return
            _open.remove(self)
        try:
            with contextlib.suppress(OSError, ValueError):
                self.stream.flush()
            os.dup2(self.before, self.descriptor)
        finally:
            self.stop.set()
            self.copier.join(DRAIN_TIMEOUT_S)


_open: list[_Mirror] = []
_lock = threading.Lock()
atexit.register(end_mirrors)


def _copy(source: int, target: int, stop: threading.Event) -> None:
    """Copy what `source` holds to `target` as it grows, until `stop` is set and what was written before it is copied;
    then close both."""
    broken = False  # the terminal went away: the file still gets everything
    try:
        while True:
            last = stop.is_set()  # set once the descriptor was given back: every write before it is in the file now
            while chunk := os.read(source, 1 << 16):
                while chunk and not broken:
                    try:
                        chunk = chunk[os.write(target, chunk):]
                    except OSError:
                        broken = True
            if last:
                return
            stop.wait(COPY_INTERVAL_S)
    finally:
        os.close(source)
        os.close(target)
