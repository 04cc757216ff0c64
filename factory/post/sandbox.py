"""Run untrusted Python in a separate, confined process: the code is data, never trusted.

Each execution gets an empty temporary working directory, a minimal environment, and a fresh
process in its own session. Before the code runs, the child confines itself (all of it before
the code is even read):

- resource limits: CPU seconds, address space, file size, open files, no core dumps;
- no network: a new network namespace when the kernel allows it (root), and in any case an audit
  hook that refuses socket creation;
- no new processes: as root, it drops to a uid of its own with RLIMIT_NPROC 1; in any case the
  audit hook refuses fork, exec, spawn, subprocess and os.system;
- no writes outside its directory, no ctypes, no signals to other processes: the audit hook again.

The parent enforces wall time and output size, kills the whole session at the end, and removes
the directory. A crash, a limit or a refusal is an outcome (`status`), never an exception here.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Literal

Status = Literal["ok", "error", "timeout", "memory", "output_limit"]
UID_BASE = 61000
"""Executions as root run as uid/gid UID_BASE + slot: each slot its own user, so RLIMIT_NPROC 1 means no fork."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    """What one execution may use."""

    cpu_s: int = 2
    wall_s: float = 5.0
    memory_mb: int = 256
    file_mb: int = 1
    output_bytes: int = 64_000


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """What happened: `ok` means the code ran to the end and exited 0."""

    status: Status
    stdout: str
    stderr: str
    """The last lines the code wrote to stderr (its traceback, for an error)."""
    seconds: float


# Runs in the child before the untrusted code; the code arrives on stdin only after this has run.
CONFINE = r"""
def confine():
    import os, resource, sys
    cpu, memory, fsize, uid, netns = (int(a) for a in sys.argv[1:6])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))
    if netns:
        import ctypes
        ctypes.CDLL(None, use_errno=True).unshare(0x40000000)  # CLONE_NEWNET; sockets are refused below regardless
    if uid:
        resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    home = os.path.realpath(os.getcwd()) + os.sep
    write = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    refused = frozenset({
        "socket.__new__", "socket.connect", "socket.bind", "os.system", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn",
        "subprocess.Popen", "os.kill", "os.killpg", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "sys.addaudithook", "sys._getframe",
        "object.__getattr__",
    })
    modules = frozenset({"gc", "ctypes", "_ctypes", "_posixsubprocess", "multiprocessing", "socket", "_socket", "signal"})
    paths = frozenset({"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link", "os.symlink",
                       "os.truncate", "os.utime", "os.replace", "shutil.rmtree", "shutil.move", "shutil.copyfile"})
    realpath, fsdecode = os.path.realpath, os.fsdecode

    def inside(path):
        try:
            return isinstance(path, int) or realpath(fsdecode(path)).startswith(home)
        except (TypeError, ValueError):
            return False

    def guard(event, args):
        if event in refused or (event == "import" and args[0].partition(".")[0] in modules):
            raise PermissionError(f"sandbox: {event} {args[0] if event == 'import' else ''}".rstrip() + " is not allowed")
        if event == "open" and args[0] is not None and ((args[1] and any(c in args[1] for c in "wax+")) or (args[2] or 0) & write):
            if not inside(args[0]):
                raise PermissionError("sandbox: writing outside the working directory is not allowed")
        if event in paths and not all(inside(a) for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))):
            raise PermissionError(f"sandbox: {event} outside the working directory is not allowed")

    source = sys.stdin.read()
    sys.addaudithook(guard)
    return source


exec(compile(confine(), "<sandbox>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
"""

class Sandbox:
    """Runs code under `limits`; `workers` executions at a time in `run_many`."""

    def __init__(self, limits: Limits = Limits(), workers: int = 2, python: str = sys.executable) -> None:
        self.limits = limits
        self.workers = workers
        self.python = python
        self._slots = list(range(workers))
        self._lock = threading.Lock()

    def run(self, source: str) -> Outcome:
        """Execute `source` once."""
        with self._lock:
            slot = self._slots.pop() if self._slots else self.workers
        try:
            return self._run(source, slot)
        finally:
            with self._lock:
                if slot < self.workers:
                    self._slots.append(slot)

    def run_many(self, sources: Sequence[str]) -> list[Outcome]:
        """Execute each source, `workers` at a time; outcomes in the same order."""
        with ThreadPoolExecutor(self.workers) as pool:
            return list(pool.map(self.run, sources))

    def _run(self, source: str, slot: int) -> Outcome:
        limits, root = self.limits, os.geteuid() == 0
        uid = UID_BASE + slot if root else 0
        work = tempfile.mkdtemp(prefix="sandbox-")
        if root:
            os.chown(work, uid, uid)
        argv = [self.python, "-I", "-S", "-B", "-c", CONFINE, str(limits.cpu_s), str(limits.memory_mb << 20), str(limits.file_mb << 20),
                str(uid), "1" if root else "0"]
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
        started = time.perf_counter()
        process = subprocess.Popen(argv, cwd=work, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   start_new_session=True)
        out, err = _Capped(process, process.stdout, limits.output_bytes), _Capped(process, process.stderr, limits.output_bytes)
        try:
            process.stdin.write(source.encode())
            process.stdin.close()
        except BrokenPipeError:
            pass
        timed_out = False
        try:
            process.wait(timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_session(process)
            out.join()
            err.join()
            shutil.rmtree(work, ignore_errors=True)
        seconds = time.perf_counter() - started
        stderr = "".join(err.text().splitlines(keepends=True)[-10:])
        return Outcome(status=_status(process.returncode, timed_out, out.overflow, stderr), stdout=out.text(), stderr=stderr, seconds=seconds)


class _Capped(threading.Thread):
    """Reads a pipe, keeping at most `cap` bytes; past that the whole session is killed: a flood of output ends at once."""

    def __init__(self, process: subprocess.Popen, stream: IO[bytes], cap: int) -> None:
        super().__init__(daemon=True)
        self.process, self.stream, self.cap, self.data, self.overflow = process, stream, cap, bytearray(), False
        self.start()

    def run(self) -> None:
        while chunk := self.stream.read1(65536):
            room = self.cap - len(self.data)
            self.data += chunk[:room]
            if len(chunk) > room:
                self.overflow = True
                _kill_session(self.process, wait=False)
                break

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def _kill_session(process: subprocess.Popen, wait: bool = True) -> None:
    """Kill the child and anything it started in its session."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if wait:
        process.wait()


def _status(code: int | None, timed_out: bool, overflow: bool, stderr: str) -> Status:
    if overflow:
        return "output_limit"
    if timed_out or code in (-signal.SIGXCPU, -signal.SIGKILL):
        return "timeout"
    if "MemoryError" in stderr:
        return "memory"
    return "ok" if code == 0 else "error"
