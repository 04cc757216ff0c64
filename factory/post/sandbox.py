"""Run untrusted Python in a separate, confined process: the code is data, never trusted.

Each execution gets an empty working directory, a minimal environment, and a fresh interpreter in
its own session. The boundary is the operating system, set up before the code is even read:

- resource limits: CPU seconds, address space, file size, open files, no core dumps;
- as root (the usual case in containers and CI): a uid of its own (claimed across processes)
  with RLIMIT_NPROC 1, so it cannot start a process or thread, cannot signal other processes and
  cannot write where that uid may not;
- as root with bubblewrap (`sandbox_mounts`): mount, pid, network, IPC and UTS namespaces in
  which only the interpreter, its stdlib, the packages it was given and the system libraries
  exist (read-only), and every writable place is a private size-capped tmpfs that ends with the
  execution: no registry, catalog, repository or other process to read, nothing planted that
  outlives it. Without bubblewrap, `unshare` gives network and IPC namespaces and the shared
  directories are swept;
- a seccomp filter (`sandbox_seccomp`): no `unshare`, `setns` or `clone` into a new namespace, so
  the code cannot become root of a user namespace of its own, whatever it does to the hook;
- a Python audit hook (and a first import finder) refuses sockets, fork/exec/subprocess, ctypes,
  gc, the hook's own frames and writes outside the directory (a refused import is an ImportError,
  so optional imports fall back). It is defence in depth, never the boundary: code can turn it
  off, so without root (`Sandbox.isolation` says what holds) the sandbox is best effort.

Any module of the standard library imports as that uid, wherever the interpreter is installed, and so
do the installed distributions a caller names (`packages`: their top-level files bound read-only, the
directory holding them put on `sys.path`); nothing is imported for the code beforehand. Stdlib modules
that need a refused one (email.utils imports socket, asyncio) are refused with it. The uid often cannot
enter the interpreter's directory (a pyenv under /root, mode 0700). With bubblewrap the prefix is bound at
its own path below directories made enterable in the namespace's own root (`sandbox_mounts`); the host's
directories are never chmod-ed. Without a mount namespace (and as a fallback with one) each directory on
`sys.path` is opened while still root and, where the uid cannot enter it, read through `/proc/self/fd/N`
after the drop (a process may always follow its own descriptors; the others are closed); packages
imported at start (encodings) look there too. Through `..` such a descriptor also reaches the
world-readable files between the installation and the directory the uid could not enter (/root/.pyenv's
other interpreters), never that directory itself: on a path that leaves the host's world-readable files
to the uid anyway.

The parent enforces wall time and output size, kills the whole session before reaping it, and
removes the directory. A crash, a limit or a refusal is an outcome (`status`), never an exception.
A CPU-limit timeout is told from code that exits with the status a signal gives (`sys.exit(137)`,
which bubblewrap reports as it would a SIGKILL): an interpreter that exits writes to a pipe the
parent reads; one that a signal ends cannot.
"""

from __future__ import annotations

import fcntl
import os
import platform
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
from pathlib import Path
from typing import IO, Literal

from factory.errors import ArtifactError
from factory.post.sandbox_mounts import bwrap_argv, bwrap_works, package_paths
from factory.post.sandbox_seccomp import INSTALL, namespace_filter

Status = Literal["ok", "error", "timeout", "memory", "output_limit"]
UID_BASE = 61000
UID_COUNT = 512
"""As root, each execution runs as a uid of its own from this range, claimed with a lock file across processes."""
UID_LOCKS = Path(tempfile.gettempdir()) / "factory-sandbox-uids"
SHARED_DIRS = ("/tmp", "/var/tmp", "/run/lock", "/dev/shm")
"""World-writable places the sandbox user could still reach: swept of its files after each execution."""
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
"""The code may start no thread (RLIMIT_NPROC 1): a numeric package that starts a pool at import (numpy's OpenBLAS) is told not to."""
EXITED = b"exited"
"""What the interpreter writes to its status pipe as it exits (an exit status, not a signal, ended it)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    """What one execution may use."""

    cpu_s: int = 2
    wall_s: float = 5.0
    memory_mb: int = 256
    file_mb: int = 1
    output_bytes: int = 64_000
    tmpfs_mb: int = 16
    """Size of each private tmpfs (working directory, /tmp, /var/tmp, /run/lock, /dev/shm) in a mount namespace: memory
    outside `memory_mb` (tmpfs pages count against no rlimit), so at most five times this, freed when the execution ends."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """What happened: `ok` means the code ran to the end and exited 0."""

    status: Status
    stdout: str
    stderr: str
    """The last lines the code wrote to stderr (its traceback, for an error)."""
    seconds: float
    stopped_by: Literal["cpu", "wall"] | None = None
    """For a timeout, which limit ended it: the CPU seconds (the kernel's SIGXCPU, then SIGKILL) or the wall clock."""
    exit_code: int | None = None
    """How the process ended when no limit of the sandbox did: its exit status, or -N when signal N killed it (under
    bubblewrap, a death by signal N reads as status 128 + N). None when the sandbox stopped it."""


# Runs in the child (still root, when the parent is) before the untrusted code; the code arrives on stdin only after this.
CONFINE = INSTALL + r"""
def confine():
    import os, resource, sys
    cpu, memory, fsize, uid, paths = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    program, status = sys.argv[6], int(sys.argv[7])
    import atexit
    atexit.register(os.write, status, b"exited")  # EXITED, read by the parent: an exit, not a signal (which runs no atexit)
    sys.path += [path for path in paths.split(os.pathsep) if path]
    opened = {path: os.open(path, os.O_RDONLY | os.O_DIRECTORY) for path in sys.path if os.path.isdir(path)}
    install, code = filter_installer(bytes.fromhex(program)) if program else (None, None)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))
    if uid:
        resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    reach_imports(opened)
    if install:
        install()
    del install, code  # the filter's buffer may go: the kernel copied it
    # Defence in depth, not the boundary: code can subvert an audit hook. Builtins are bound here so patching them is no help.
    isinstance_, any_, all_, str_, bytes_, int_, frozenset_, ImportError_ = isinstance, any, all, str, bytes, int, frozenset, ImportError
    realpath, fsdecode, write = os.path.realpath, os.fsdecode, os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    home = realpath(os.getcwd()) + os.sep
    refused = frozenset_({
        "socket.__new__", "socket.connect", "socket.bind", "os.system", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn",
        "subprocess.Popen", "os.kill", "os.killpg", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "sys.addaudithook",
        "resource.setrlimit", "resource.prlimit", "os.mkfifo", "os.mknod", "os.setxattr", "os.removexattr",
    })
    blocked = frozenset_({"gc", "ctypes", "_ctypes", "_posixsubprocess", "multiprocessing", "socket", "_socket", "signal", "_signal",
                          "resource", "subprocess", "mmap"})
    paths = frozenset_({"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link", "os.symlink",
                        "os.truncate", "os.utime", "os.replace", "shutil.rmtree", "shutil.move", "shutil.copyfile"})

    def not_allowed(name):  # an ImportError: optional imports fall back
        return ImportError_("sandbox: import " + name + " is not allowed", name=name)

    class Blocked:  # importlib.import_module reaches a builtin (gc) or a loaded extension without an import event
        @staticmethod
        def find_spec(name, path=None, target=None):
            if str_(name).partition(".")[0] in blocked:
                raise not_allowed(str_(name))

    def inside(path):
        try:
            return realpath(fsdecode(path)).startswith(home)
        except (TypeError, ValueError):
            return False

    def guard(event, args):
        if event == "sys._getframe":  # the stdlib needs frames (namedtuple, TypeVar); code the hook itself calls gets none
            frame = args[0]
            while frame is not None:
                if frame.f_code is guard.__code__ or frame.f_code is inside.__code__:
                    raise PermissionError("sandbox: sys._getframe from inside the audit hook is not allowed")
                frame = frame.f_back
        if event == "import" and str_(args[0]).partition(".")[0] in blocked:
            raise not_allowed(str_(args[0]))
        if event in refused:
            raise PermissionError("sandbox: " + event + " is not allowed")
        if event == "open" and args[0] is not None:
            writes = (args[1] and any_(c in str_(args[1]) for c in "wax+")) or (int_(args[2] or 0) & write)
            if writes and (isinstance_(args[0], int_) or not inside(args[0])):
                raise PermissionError("sandbox: writing outside the working directory is not allowed")
        if event in paths and not all_(isinstance_(a, (str_, bytes_)) and inside(a) for a in args[:2] if a is not None and not isinstance_(a, int_)):
            raise PermissionError("sandbox: " + event + " outside the working directory is not allowed")

    for name in [name for name in sys.modules if name.partition(".")[0] in blocked]:
        del sys.modules[name]  # imported before the hook (resource, _signal): importing them again goes through it
    sys.meta_path.insert(0, Blocked)
    source = sys.stdin.read()
    sys.addaudithook(guard)
    return source


def reach_imports(opened):
    # A directory on sys.path that the uid cannot enter (an interpreter under /root, no mount namespace) is read through
    # the descriptor opened before the drop: /proc/self/fd/N stays open to its own process. Others are closed.
    import os, sys
    through = {}
    for path, fd in opened.items():
        if os.access(path, os.R_OK | os.X_OK):
            os.close(fd)
        else:
            through[path] = "/proc/self/fd/" + str(fd)

    def moved(entry):
        for path, fd_path in through.items():
            if entry == path or entry.startswith(path + os.sep):
                return fd_path + entry[len(path):]
        return entry

    sys.path[:] = [moved(entry) for entry in sys.path]
    for module in list(sys.modules.values()):  # packages imported at start (encodings) find their submodules there too
        if isinstance(getattr(module, "__path__", None), list):
            module.__path__[:] = [moved(entry) for entry in module.__path__]
    sys.path_importer_cache.clear()


exec(compile(confine(), "<sandbox>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
"""


class Sandbox:
    """Runs code under `limits`; `workers` executions at a time in `run_many`.

    `isolation` says what holds the code: as root, its own uid (RLIMIT_NPROC 1: no process of its own); with bubblewrap,
    a mount and pid namespace showing only the interpreter (`mount_namespace=False` keeps the older path, for comparison);
    without it network and IPC namespaces when `unshare` works, files it leaves in shared directories swept; without root
    only the limits and the hook. `packages` names installed distributions the code may import besides the stdlib (each
    one's dependencies must be named too); one not installed is a ConfigError.
    """

    def __init__(self, limits: Limits = Limits(), workers: int = 2, python: str = sys.executable, mount_namespace: bool = True,
                 packages: Sequence[str] = ()) -> None:
        self.limits = limits
        self.workers = workers
        self.python = python
        self.packages = tuple(packages)
        self.package_entries, self.package_sites = package_paths(packages)
        self.root = os.geteuid() == 0
        self.mounts = mount_namespace and self.root and bwrap_works()
        self.namespaces = self.mounts or (self.root and _unshare_works())
        self.seccomp = namespace_filter(platform.machine())
        isolation = ("own uid; mount, pid, network and IPC namespaces: only the interpreter, private tmpfs" if self.mounts
                     else "own uid, network and IPC namespaces; the host's files readable as that uid" if self.namespaces
                     else "own uid; the host's files and network reachable as that uid" if self.root else "limits and audit hook only")
        self.isolation = isolation + ("; no new namespaces (seccomp)" if self.seccomp else "")

    def run(self, source: str) -> Outcome:
        """Execute `source` once; whatever it does is an outcome, never an exception here."""
        uid, lock = _claim_uid() if self.root else (0, -1)
        work = None if self.mounts else tempfile.mkdtemp(prefix="sandbox-")  # in a mount namespace: a tmpfs of its own
        try:
            if uid and work:
                os.chown(work, uid, uid)
            return self._run(source.encode("utf-8", errors="surrogatepass"), uid, work)
        finally:
            if work:
                shutil.rmtree(work, onerror=_force_remove)
            if uid and not self.mounts:
                _sweep(uid)
            if uid:
                os.close(lock)

    def run_many(self, sources: Sequence[str]) -> list[Outcome]:
        """Execute each source, `workers` at a time; outcomes in the same order."""
        with ThreadPoolExecutor(self.workers) as pool:
            return list(pool.map(self.run, sources))

    def _run(self, source: bytes, uid: int, work: str | None) -> Outcome:
        limits = self.limits
        argv = [self.python, "-P", "-s", "-S", "-B", "-c", CONFINE, str(limits.cpu_s), str(limits.memory_mb << 20), str(limits.file_mb << 20),
                str(uid), os.pathsep.join(map(str, self.package_sites)), self.seccomp.hex() if self.seccomp else ""]
        status_read, status_write = os.pipe()
        argv.append(str(status_write))
        if self.mounts:
            argv = [*bwrap_argv(self.python, limits.tmpfs_mb << 20, self.package_entries), *argv[1:]]
        elif self.namespaces:
            argv = ["unshare", "--net", "--ipc", "--", *argv]
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", **ONE_THREAD}
        started = time.perf_counter()
        try:
            process = subprocess.Popen(argv, cwd=work or "/", env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, start_new_session=True, pass_fds=(status_write,))
        except OSError:
            os.close(status_read)
            raise
        finally:
            os.close(status_write)  # the child's copy is the only writer left
        out, err = _Capped(process, process.stdout, limits.output_bytes), _Capped(process, process.stderr, limits.output_bytes)
        try:
            process.stdin.write(source)
            process.stdin.close()
        except BrokenPipeError:
            pass
        timed_out = not _exited(process.pid, started + limits.wall_s)
        _kill_session(process)  # before reaping: the session's id cannot have been reused
        out.join(timeout=2)
        err.join(timeout=2)
        seconds = time.perf_counter() - started
        stderr = "".join(err.text().splitlines(keepends=True)[-10:])
        code = _ending(process.returncode, exited=_read_status(status_read) == EXITED, bubblewrap=self.mounts)
        cpu_limit = code in (-signal.SIGXCPU, -signal.SIGKILL)
        overflow = out.overflow or err.overflow
        status = _status(code, timed_out or cpu_limit, overflow, stderr)
        stopped_by = None if status != "timeout" else "wall" if timed_out else "cpu"
        exit_code = None if timed_out or cpu_limit or overflow else code
        return Outcome(status=status, stdout=out.text(), stderr=stderr, seconds=seconds, stopped_by=stopped_by, exit_code=exit_code)


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
                _signal_session(self.process.pid)
                break

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def _unshare_works() -> bool:
    """Whether `unshare --net --ipc` can run a command here (root with the capability, util-linux installed)."""
    try:
        return subprocess.run(["unshare", "--net", "--ipc", "--", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _claim_uid() -> tuple[int, int]:
    """A sandbox uid no other execution (in any process) is using, and the lock file descriptor that holds it."""
    UID_LOCKS.mkdir(mode=0o700, exist_ok=True)
    for uid in range(UID_BASE, UID_BASE + UID_COUNT):
        fd = os.open(UID_LOCKS / str(uid), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return uid, fd
        except BlockingIOError:
            os.close(fd)
    raise ArtifactError(f"all {UID_COUNT} sandbox uids are in use; run fewer sandboxes at once")


def _exited(pid: int, deadline: float) -> bool:
    """Wait until the child exits (without reaping it) or the deadline passes; whether it exited."""
    while time.perf_counter() < deadline:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        time.sleep(0.005)
    return False


def _signal_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_session(process: subprocess.Popen) -> None:
    """Kill the child and anything it started in its session, then reap it."""
    _signal_session(process.pid)
    process.wait()


def _read_status(fd: int) -> bytes:
    """What the reaped execution wrote to its status pipe, without waiting for writers it may have left; closes the pipe."""
    try:
        os.set_blocking(fd, False)
        return os.read(fd, len(EXITED) + 1)
    except BlockingIOError:
        return b""
    finally:
        os.close(fd)


def _ending(returncode: int, exited: bool, bubblewrap: bool) -> int:
    """The exit status, or -N for a death by signal N: bubblewrap reports that as 128 + N, which only the interpreter's
    word that it exited tells from `sys.exit(128 + N)`."""
    if bubblewrap and returncode > 128 and not exited:
        return 128 - returncode
    return returncode


def _sweep(uid: int) -> None:
    """Remove what the sandbox user left in the world-writable directories."""
    for directory in SHARED_DIRS:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, onerror=_force_remove)
                else:
                    os.unlink(entry.path)
            except OSError:
                continue


def _force_remove(function, path, _error) -> None:
    """rmtree's second try: make the parent writable and the entry removable (code may have chmod-ed them)."""
    try:
        os.chmod(os.path.dirname(path), 0o700)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass


def _status(code: int, limited: bool, overflow: bool, stderr: str) -> Status:
    if overflow:
        return "output_limit"
    if limited:
        return "timeout"
    if code == 0:
        return "ok"
    last = stderr.strip().rsplit("\n", 1)[-1]
    return "memory" if last.startswith("MemoryError") else "error"
