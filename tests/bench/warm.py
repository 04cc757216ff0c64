"""Runs bench scripts for the smoke tests, each in a process of its own forked from this one, which has imported the
libraries they all import (torch, pyarrow, Dagster...) once: a bench's process then starts in milliseconds instead of
the two or three seconds of imports, and runs its script as `python bench/NAME` would (`__main__`, its own argv, its
directory first on sys.path, its own stdout and stderr).

Protocol, one JSON line each way: in `{"script": path, "argv": [...], "out": path, "err": path}`, out `{"code": n}` once
the bench's process ended (its output in the two files).
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import traceback

WARM = ("numpy", "torch", "dagster", "factory.config")
"""What every bench imports, or most, imported before any fork: none starts a thread on import, and none reads a setting
a bench sets before importing it (transformers' HF_HUB_OFFLINE, for one, is left to the benches; pyarrow, whose
allocator starts a thread, too)."""


def run(request: dict) -> int:
    """Fork, run the script in the child with its output in the request's files, and return its exit status."""
    pid = os.fork()
    if pid == 0:  # the bench's own process
        code = 1
        try:
            for fd, path in ((1, request["out"]), (2, request["err"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the protocol's pipe is not the bench's, nor its children's
            sys.stdin = open(0, closefd=False)  # noqa: SIM115
            sys.argv = [request["script"], *request["argv"]]
            sys.path.insert(0, os.path.dirname(request["script"]))
            try:
                runpy.run_path(request["script"], run_name="__main__")
                code = 0
            except SystemExit as e:  # as the interpreter ends on it: a number is the status, a message is printed, status 1
                if e.code is None or isinstance(e.code, int):
                    code = e.code or 0
                else:
                    print(e.code, file=sys.stderr)
            except BaseException:  # noqa: BLE001  (what Python prints for an uncaught exception, and exit 1)
                traceback.print_exc()
        finally:
            atexit._run_exitfuncs()  # what an interpreter's exit runs (a bench's own handlers), then no teardown
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def main() -> None:
    for name in WARM:
        __import__(name)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        print(json.dumps({"code": run(json.loads(line))}), flush=True)


if __name__ == "__main__":
    main()
