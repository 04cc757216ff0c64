"""A port for a server a test (or a bench) starts on 127.0.0.1, the wait until it serves, and its stop."""

import contextlib
import socket
import subprocess
import time
from collections.abc import Callable


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's choice of an ephemeral one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serving(ready: Callable[[], object], process: subprocess.Popen, timeout_s: float, interval_s: float,
            errors: tuple[type[BaseException], ...]) -> bool:
    """Whether `ready()` answered true (raising one of `errors` is not yet) before `process` ended or `timeout_s` passed;
    asked every `interval_s`. The caller says why it did not start, in its own way (a test fails, a bench exits)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(*errors):
            if ready():
                return True
        if process.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(interval_s)


def stopped(process: subprocess.Popen, timeout_s: float) -> None:
    """Terminate `process`; kill it if it has not ended within `timeout_s`. Returns once it has ended."""
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
