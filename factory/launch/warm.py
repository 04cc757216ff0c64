"""A warm interpreter: stage processes forked from a server that imported their code once.

Starting a stage as `python -m factory.runtime request.json` costs seconds of imports (torch,
pyiceberg, pyarrow, mlflow) before any work, and a run starts a dozen stages. The warm server
imports those modules once, then forks one child per stage. The child is still a process of its
own, as the launcher and Volcano expect: its own pid, exit code, stdin/stdout/stderr, environment
and working directory; killed alone; it ends when its stage does. A child starts in milliseconds.

The server forks only where the child is the process a cold start would have made:
- it runs no Python thread but its own, checked once its imports are done (a fork copies only
  the calling thread: a lock another thread held would stay locked in the child). The native
  pools some libraries start at import (numpy's OpenBLAS, pyarrow's jemalloc) sit idle, and
  those libraries prepare for fork themselves, as they do for multiprocessing's fork start
  method and PyTorch's data-loader workers; torch's own thread pool starts in the child, at its
  first parallel operation, since the server never runs one;
- the code on disk is the code it imported: every source file of the packages it preloaded keeps
  the size and mtime it had (those in a directory of installed packages: the directory's mtime, which
  installing, upgrading or removing a package changes);
- the child's environment equals the server's but for the variables the launch itself sets
  (Dagster Pipes' bootstrap, the progress flag): whatever libraries read at import is the same.
Otherwise it refuses, and `spawn` returns None: the launcher starts a cold process, as before.
Linux only (fork after importing torch is not safe on macOS).

The server is `factory.launch.warm_server`. The protocol: a Unix socket; the launcher sends one JSON request with the child's stdin, stdout
and stderr as file descriptors (SCM_RIGHTS), and a pipe the child writes its exit code on as it ends (the server is busy
while it imports); the server answers `{"pid": n}` (or `{"refused": why}`), then `{"exit": code}` when the child ends
(negative: killed by that signal), which the launcher waits for when the child wrote no code. A status
request (`{"status": true, "preload": [MODULE...]}`) is answered with how far the imports are and
what would stop a fork, and adds the modules to those it imports.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

SERVER_MODULE = "factory.launch.warm_server"
SHARED_SOCKET_ENV = "FACTORY_WARM_SOCKET"
"""Set by `factory ui` for every process Dagster starts under it: the socket of the warm interpreter it shares, which the
stages of the runs its daemon and UI launch fork from (`WarmServer.attach`)."""
SOCKET_NAME = "warm.sock"
READY_TIMEOUT_S = 120.0
"""How long a launch waits for the server's socket to appear (its imports run after it binds)."""
REUSE_TIMEOUT_S = 30.0
"""How long a block waits for a kept server to say it can serve again (it answers between two imports) before it starts
a new one."""
EXIT_UNKNOWN = 255
"""The exit code reported when the server ended before the child it forked."""
_HEADER = struct.Struct("!I")


class WarmServer:
    """The launcher's side: starts the server, asks it for children, and stops it."""

    def __init__(self, modules: Sequence[str], env: Mapping[str, str] | None = None, first: int | None = None) -> None:
        """Start a server that imports `modules` (in the background: `spawn` waits for it) in the environment `env` (default:
        ours), which its children's must equal but for what a launch sets. `first`: how many of `modules` the first launch
        needs (default: all); once those are imported, the rest wait for that launch (`warm_server.HOLD_S`)."""
        self.modules = tuple(modules)
        self._dir = Path(tempfile.mkdtemp(prefix="factory-warm-"))
        self.socket_path = self._dir / SOCKET_NAME
        self.env = dict(os.environ if env is None else env)
        owner_read, self._owner = os.pipe()  # the server ends when this end closes: when we close it, or die
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", SERVER_MODULE, str(self.socket_path), str(owner_read),
                 *([] if first is None else [f"--first={first}"]), *self.modules],
                pass_fds=(owner_read,), stdin=subprocess.DEVNULL, env=self.env,
            )
        finally:
            os.close(owner_read)
        self.refused: str | None = None
        """Why the server last refused a launch (None: it never did)."""

    @classmethod
    def attach(cls, socket_path: Path) -> WarmServer:
        """A handle on the server another process started and owns (`factory ui`'s, named by SHARED_SOCKET_ENV): launches
        fork from it while it answers; closing the handle leaves it running."""
        handle = cls.__new__(cls)
        handle.modules, handle.env, handle.socket_path, handle.refused = (), {}, socket_path, None
        handle._dir, handle._owner, handle._process = None, -1, None
        return handle

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], launch_keys: Iterable[str], needs: Sequence[str] = (),
              cwd: Path | None = None, stdout: int = 1, stderr: int | None = None) -> WarmProcess | None:
        """Fork `argv` (`python -m MODULE ARGS...`) with environment `env`, or None when the server cannot run it as a
        cold start would. `launch_keys` name the variables this launch sets, the only ones that may differ; `needs`, the
        modules the child will import: the server imports those of them it has not yet before it forks (the child would
        otherwise import them while the server does the same, on the same cores). It runs in `cwd` (default: ours) and
        writes its stdout to the file descriptor `stdout` (default: ours) and its stderr to `stderr` (default: a pipe, read
        from `WarmProcess.stderr`)."""
        if len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-m" or not self._running():
            return None
        connection = self._connect()
        if connection is None:
            return None
        stderr_read, stderr_write = os.pipe() if stderr is None else (None, stderr)
        exit_read, exit_write = os.pipe()  # the child writes its exit code there as it ends (the server may be mid-import)
        try:
            request = {"module": argv[2], "args": list(argv[3:]), "env": dict(env), "launch": sorted(launch_keys),
                       "cwd": str(cwd or os.getcwd()), "needs": list(needs)}
            send_request(connection, request, [0, stdout, stderr_write, exit_write])
            answer = (lines := _Lines(connection)).next(timeout=None)
        except OSError:  # ours, or the server went as it answered: start cold, without a reason to tell
            _close(connection, exit_read, stderr_read)
            return None
        finally:
            os.close(exit_write)
            if stderr_read is not None:
                os.close(stderr_write)
        if answer is None or "pid" not in answer:
            self.refused = answer.get("refused", "the server ended") if answer else "the server ended"
            _close(connection, exit_read, stderr_read)
            return None
        return WarmProcess(answer["pid"], lines, None if stderr_read is None else os.fdopen(stderr_read, "rb", buffering=0), exit_read)

    def status(self, timeout: float | None = None, preload: Sequence[str] = ()) -> dict[str, Any] | None:
        """How far the server's imports are: `imported` of `modules`, the `problem` that stops it forking, and what is
        `stale` (a source file changed since it imported its package, or the installed packages; None: nothing is) (None:
        no server to ask, or no answer within `timeout` seconds). Where nothing is stale and no import failed, it imports
        `preload` too, from now on between launches."""
        connection = self._connect()
        if connection is None:
            return None
        try:
            send_request(connection, {"status": True, "preload": list(preload)}, [])
            answer = _Lines(connection).next(timeout=timeout)
        except OSError:
            return None
        finally:
            connection.close()
        return None if answer is _Lines.PENDING else answer

    def reusable(self, modules: Sequence[str] = ()) -> bool:
        """Whether the server still forks as a cold start would: it answers (within REUSE_TIMEOUT_S), its imports
        succeeded, and neither the code it imported nor the installed packages changed since. Then it imports those of
        `modules` it was not asked for yet, in the background, as it imported its first ones."""
        more = list(dict.fromkeys(module for module in modules if module not in self.modules))
        status = self.status(REUSE_TIMEOUT_S, more) if self._running() else None
        if status is None or status["problem"] is not None or status.get("stale") is not None:
            return False
        self.modules = (*self.modules, *more)
        return True

    def close(self) -> None:
        """Stop the server (children it forked run on to their end) and remove its socket; a handle from `attach` only
        lets go of it."""
        if self._process is None:
            return
        if self._owner >= 0:
            os.close(self._owner)
            self._owner = -1
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _running(self) -> bool:
        """Whether the server may still answer (a server this handle did not start: until a connection fails)."""
        return self._process is None or self._process.poll() is None

    def _connect(self) -> socket.socket | None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline and self._running():
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                connection.connect(str(self.socket_path))
                return connection
            except (FileNotFoundError, ConnectionRefusedError):
                connection.close()
                if self._process is None:
                    return None  # another's server binds before its owner names it: gone, not starting
                time.sleep(0.02)
        return None


class WarmProcess:
    """A forked stage process: the part of `subprocess.Popen` the local launcher uses."""

    def __init__(self, pid: int, lines: _Lines, stderr: IO[bytes] | None, exited: int | None = None) -> None:
        self.pid = pid
        self.stderr = stderr
        self.returncode: int | None = None
        self._lines = lines
        self._exited = exited
        """The pipe the child writes its exit code on as it ends (nothing when a signal ends it): the server reports the
        same, but only between two imports."""
        self._gone = _pidfd(pid) if exited is not None else None
        """Readable once the child has ended (a pidfd), so that `wait` returns when it is gone, not as it writes its code."""

    def poll(self) -> int | None:
        """The exit code once the process has ended, else None."""
        if self.returncode is None:
            self._read(timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to end; subprocess.TimeoutExpired after `timeout` seconds."""
        if self.returncode is None:
            self._read(timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
        return self.returncode

    def kill(self) -> None:
        """SIGKILL the process, unless it has ended already."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def _read(self, timeout: float | None) -> None:
        if self._exited is not None:  # the child's own word, once it is gone; else the server's report
            deadline = None if timeout is None else time.monotonic() + timeout
            mark = self._gone if self._gone is not None else self._exited
            if mark in select.select([mark, self._lines.connection], [], [], timeout)[0] and (told := self._told()) is not None:
                self._end(told)
                return
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        answer = self._lines.next(timeout)
        if answer is _Lines.PENDING:
            return
        if answer is None:  # the server is gone: wait for the child itself, whose exit code only it may have told
            while _alive(self.pid):
                time.sleep(0.05)
            told = self._told() if self._exited is not None else None
            self._end(EXIT_UNKNOWN if told is None else told)
        else:
            self._end(int(answer["exit"]))

    def _told(self) -> int | None:
        """The exit code the child wrote, if it wrote one (the pipe and the pidfd closed, either way)."""
        said = os.read(self._exited, 64) if select.select([self._exited], [], [], 0)[0] else b""
        for fd in (self._exited, self._gone):
            if fd is not None:
                os.close(fd)
        self._exited = self._gone = None
        return int(said) if said.strip().isdigit() else None

    def _end(self, code: int) -> None:
        self.returncode = code
        self._lines.close()
        if self._exited is not None:
            self._told()


def _pidfd(pid: int) -> int | None:
    """A descriptor readable once process `pid` has ended (Linux 5.3 and later), or None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # an older kernel, or the process ended and was reaped already
        return None


def _close(connection: socket.socket, *fds: int | None) -> None:
    connection.close()
    for fd in fds:
        if fd is not None:
            os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Lines:
    """JSON lines from a socket, read without blocking longer than asked."""

    PENDING: Any = object()

    def __init__(self, connection: socket.socket) -> None:
        self.connection = connection
        self.buffer = b""

    def next(self, timeout: float | None) -> Any:
        """The next message; PENDING when none came within `timeout`; None when the other side closed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.connection], [], [], left)[0]:
                return self.PENDING
            chunk = self.connection.recv(4096)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        self.connection.close()


def send_request(connection: socket.socket, message: dict[str, Any], fds: list[int]) -> None:
    """A request: its length, its JSON, and the child's stdin, stdout and stderr (and the pipe it tells its exit code on)
    riding along (SCM_RIGHTS)."""
    data = json.dumps(message).encode()
    socket.send_fds(connection, [_HEADER.pack(len(data)) + data], fds)


def receive_request(connection: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The request `send_request` sent, and the file descriptors that came with it."""
    data, fds, _, _ = socket.recv_fds(connection, 1 << 20, 4)
    (size,) = _HEADER.unpack_from(data)
    body = data[_HEADER.size :]
    while len(body) < size:
        chunk = connection.recv(size - len(body))
        if not chunk:
            raise ConnectionError("the launcher closed the connection mid-request")
        body += chunk
    return json.loads(body), list(fds)
