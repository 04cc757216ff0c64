"""Commands the tests run many times, each in a process of its own forked from one that imported what they import: a
process then starts in milliseconds instead of the seconds (a bench: torch, pyarrow, Dagster) or the half second (the
`factory` command line) of its imports, and runs as `python SCRIPT ARGS` or `python -m MODULE ARGS` would: `__main__`,
its own argv, environment, working directory, stdout and stderr, its exit handlers at the end, its exit status.

`python -m tests.forked MODULE...` (from the repository's root) imports the modules, says `{"ready": true}`, then answers one JSON line per request:
in `{"script": path}` or `{"module": name}`, with `"argv": [...], "out": path, "err": path`, and optionally `"env": {...}`
(the whole environment; default the server's) and `"cwd": path`; out `{"code": n}` once the process ended (its output
in the two files). `ForkServer` is the tests' side.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import runpy
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(request: dict) -> int:
    """Fork, run the script or module in the child with its output in the request's files, and return its exit status."""
    pid = os.fork()
    if pid == 0:  # the command's own process
        code = 1
        try:
            if request.get("env") is not None:
                os.environ.clear()
                os.environ.update(request["env"])
            if request.get("cwd"):
                os.chdir(request["cwd"])
            for fd, path in ((1, request["out"]), (2, request["err"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the protocol's pipe is not the command's, nor its children's
            sys.stdin = open(0, closefd=False)  # noqa: SIM115
            try:
                if "module" in request:  # as `python -m` sets them: the working directory first on the path
                    sys.argv, sys.path[0] = [request["module"], *request["argv"]], os.getcwd()
                    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
                else:  # as `python SCRIPT` sets them: the script's directory first
                    sys.argv, sys.path[0] = [request["script"], *request["argv"]], os.path.dirname(os.path.abspath(request["script"]))
                    runpy.run_path(request["script"], run_name="__main__")
                code = 0
            except SystemExit as e:  # as the interpreter ends on it: a number is the status, a message is printed, status 1
                if e.code is None or isinstance(e.code, int):
                    code = e.code or 0
                else:
                    print(e.code, file=sys.stderr)
            except BaseException:  # noqa: BLE001  (as Python ends on an uncaught exception: its hook, the command's own, then exit 1)
                sys.excepthook(*sys.exc_info())
        finally:
            threading._shutdown()  # what an interpreter's exit does: wait for the threads that are not daemons,
            atexit._run_exitfuncs()  # then its exit handlers (the command's own); then no teardown
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def main() -> None:
    for name in sys.argv[1:]:
        __import__(name)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        print(json.dumps({"code": run(json.loads(line))}), flush=True)


class ForkServer:
    """`python -m tests.forked` started, importing `modules` in the environment `env` (default ours); one command at a time."""

    def __init__(self, modules: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        self.env = dict(os.environ if env is None else env)
        self.process = subprocess.Popen([sys.executable, "-m", "tests.forked", *modules], cwd=REPO, env=self.env, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, start_new_session=True)
        self._lock = threading.Lock()
        assert json.loads(self._answer(120)) == {"ready": True}

    def run(self, argv: Sequence[str], *, script: Path | None = None, module: str | None = None, env: Mapping[str, str] | None = None,
            cwd: Path | None = None, timeout_s: float = 600, directory: Path | None = None) -> subprocess.CompletedProcess:
        """`python SCRIPT ARGV` or `python -m MODULE ARGV` in a forked process, its output written under `directory` (default:
        a temporary one, removed after)."""
        scratch = None if directory is not None else Path(tempfile.mkdtemp(prefix="forked-"))
        where = directory or scratch
        out, err = where / "stdout", where / "stderr"
        request = {**({"module": module} if module else {"script": str(script)}), "argv": list(argv), "out": str(out), "err": str(err),
                   "env": None if env is None else dict(env), "cwd": None if cwd is None else str(cwd)}
        try:
            with self._lock:
                try:
                    self.process.stdin.write(json.dumps(request).encode() + b"\n")
                    self.process.stdin.flush()
                    code = json.loads(self._answer(timeout_s))["code"]
                except BaseException:  # interrupted between a request and its answer: the next answer would be this one's
                    self.stop()
                    raise
            command = ["-m", module] if module else [str(script)]
            return subprocess.CompletedProcess([sys.executable, *command, *argv], code, out.read_text(errors="replace"),
                                               err.read_text(errors="replace"))
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)

    def _answer(self, timeout_s: float) -> bytes:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        if not ready:
            self.stop()
            raise TimeoutError(f"no answer from tests.forked within {timeout_s} s")
        line = self.process.stdout.readline()
        assert line, f"tests.forked exited {self.process.wait()}"
        return line

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


_command_line: ForkServer | None = None
READ_AT_START = ("PYTHON", "COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TERM", "LANG", "LC_")
"""Environment variables (by prefix) read as the command line's modules are imported: a command whose environment
differs from the server's in one of them runs in a fresh interpreter."""


def factory_command(*args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """`python -m factory ARGS` (in `cwd`, with the environment `env`, default this process's now), forked from a server
    of this test process that imported the command line; started at the first call, stopped when the process exits. An
    environment that differs from the server's in a setting the interpreter reads as it starts gets a fresh one."""
    global _command_line
    env = dict(os.environ if env is None else env)
    started = os.environ if _command_line is None else _command_line.env
    if any(env.get(name) != started.get(name) for name in {*env, *started} if name.startswith(READ_AT_START)):
        # what the interpreter reads as it starts (the path, the hash seed, warnings...), with the plugins on the path, whose
        # kinds the configuration's schema takes in as it is imported, and what the command line's consoles read as they
        # are made (the width, colours): a fresh interpreter
        return subprocess.run([sys.executable, "-m", "factory", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout_s)
    if _command_line is None or _command_line.process.poll() is not None:
        _command_line = ForkServer(["factory.cli"], started)
        atexit.register(_command_line.stop)
    return _command_line.run(args, module="factory", env=env, cwd=cwd or Path.cwd(), timeout_s=timeout_s)


if __name__ == "__main__":
    main()
