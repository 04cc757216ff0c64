"""The local launcher: a stage as a child process of this machine, its output streamed through.

Inside `warm_starts(modules)`, a stage is forked from a warm interpreter that imported `modules`
once (`factory.launch.warm`), instead of starting Python and its imports again: the same process,
seconds sooner. A stage of several ranks forks `factory.runtime.ranks` in torchrun's place, whose
ranks fork from it in turn. Any launch the warm interpreter cannot make exactly as a cold start
would starts cold (under torchrun for ranks).
"""

from __future__ import annotations

import atexit
import codecs
import collections
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

from factory.errors import LaunchError, StageFailed
from factory.launch.warm import SHARED_SOCKET_ENV, WarmProcess, WarmServer

STAGE_MODULE = "factory.runtime"
STDERR_TAIL_LINES = 20
PROGRESS_ENV = "FACTORY_PROGRESS"
"""Set to 1 for a stage whose stderr ends on a terminal: it may draw a progress bar."""
ERROR_FILE_ENV = "FACTORY_STAGE_ERROR"
"""Where a stage writes its one-line error for the launcher to report, instead of printing it on its stderr too."""
RANK_LOGS_ENV = "PET_LOG_DIR"
"""torchrun's --log-dir, as its environment gives it: where the copies `--tee` keeps of its ranks' output go. Set to the
stage's scratch directory, which goes when the stage ends; torchrun's default is a new temporary directory per launch
that nothing removes."""
SCRATCH_ENV = "FACTORY_STAGE_SCRATCH"
"""The stage's scratch directory, which the launcher removes when the stage ends: a rank's own temporary files go there,
so that a rank killed before it could remove them (by the OOM killer, by a lost machine) leaves nothing behind."""
STOP_TIMEOUT_S = 30.0
"""How long an interrupted stage may take to unwind (release its lease, say where it stopped) before it is killed."""
DAGSTERS_OWN = re.compile(r"DAGSTER_\w*|SF_PARTNER")
"""The variables Dagster's processes set for themselves (importing dagster sets SF_PARTNER, for Snowflake's connector):
a step's environment differs from `factory ui`'s in these alone, and nothing a stage imports reads them."""
UNREAD = re.compile(r"PYTEST_CURRENT_TEST")
"""Variables that change within one process and that nothing a stage imports reads, so a warm interpreter serves
whatever they say: pytest's name of the test and phase under way (a new one for each, so no two tests of a process
would share an interpreter otherwise). A stage forked from it has the launch's values, as a cold one would."""
RANK_LINE = re.compile(r"^\[default(\d+)\]:(.*)$", re.DOTALL)
"""A line of one rank under `torchrun --tee 2`: `[default<local rank>]:<line>`."""
FAILED_RANK = re.compile(r"failed \(exitcode: -?\d+\) local_rank: (\d+)")
"""torchrun's report of the first rank that failed."""


TORCHRUN = "torch.distributed.run"
RANKS_MODULE = "factory.runtime.ranks"
"""torchrun whose ranks fork from it: what a stage of several ranks forked from the warm interpreter runs in its place."""
RANKS_NEEDS = (RANKS_MODULE, TORCHRUN, "torch.distributed.launcher.api", "factory.launch.warm_server")
"""What RANKS_MODULE imports to start the ranks: the warm interpreter imports them before it forks it."""


def stage_argv(request_path: Path, python: str = sys.executable, processes: int = 1, nodes: int = 1) -> list[str]:
    """The command that runs one stage from its request file: one process, or `processes` ranks under torchrun."""
    if nodes > 1:
        raise LaunchError(
            f"resources.nodes is {nodes}, but the local launcher runs a stage on this one machine: set resources.nodes: 1 "
            "(and processes_per_node for ranks here), or run the experiment on a cluster"
        )
    if processes > 1:  # --tee 2: each rank's stderr lines come prefixed with its rank, so a failure can quote the failing rank
        return [python, "-m", TORCHRUN, "--standalone", f"--nproc_per_node={processes}", "--tee", "2", "-m", STAGE_MODULE,
                str(request_path)]
    return [python, "-m", STAGE_MODULE, str(request_path)]


_kept: WarmServer | None = None
"""The last block's warm interpreter, kept for the next block of this process (a process that runs one experiment after
another imports once); it ends with this process."""
_blocks = 0
"""How many `warm_starts` blocks this process is in (nested, or in other threads): `_kept` is replaced only in none."""
_blocks_lock = threading.Lock()
_told: set[str] = set()


@contextlib.contextmanager
def warm_starts(modules: Sequence[str], env: Mapping[str, str] | None = None, first: int | None = None) -> Iterator[WarmServer | None]:
    """Within the block, stages fork from a warm interpreter that imports `modules` (in the background, from now on) in
    the environment `env` (default: ours). The previous block's interpreter serves again, and lives on until this
    process ends, when it was started in the same environment (but for UNREAD's variables) and the installed packages
    and the code it imported have not changed since (and it answers, its imports having succeeded); it then imports
    those of `modules` it was not asked for before, in the background as it did its first ones (any other module a
    stage needs, it imports before that stage's fork).
    Linux only; elsewhere stages start as they would without it. A block inside another (nested, or in another thread)
    shares the outer one's. `first`: how many of `modules` the first stage needs (`WarmServer`)."""
    global _kept, _blocks
    if sys.platform != "linux":
        yield None
        return
    with _blocks_lock:
        if _blocks == 0:
            wanted = dict(os.environ if env is None else env)
            if _kept is None or _compared(_kept.env) != _compared(wanted) or not _kept.reusable(modules):
                if _kept is None:
                    atexit.register(_close_kept, os.getpid())
                else:
                    _kept.close()
                _kept = WarmServer(modules, wanted, first)
        _blocks += 1
        server = _kept
    try:
        yield server
    finally:
        with _blocks_lock:
            _blocks -= 1


def _compared(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of `env` a warm interpreter started in it may have read (all but UNREAD's)."""
    return {name: value for name, value in env.items() if not UNREAD.fullmatch(name)}


def _close_kept(owner: int) -> None:
    """At exit: stop the kept warm interpreter, in the process that started it only (not in a fork of it)."""
    global _kept
    if _kept is not None and os.getpid() == owner:
        server, _kept = _kept, None
        server.close()


def progress_env(stream: IO[str] | None = None) -> dict[str, str]:
    """`FACTORY_PROGRESS=1` when `stream` (stderr) is a terminal: stages may draw a live progress bar; plain logs elsewhere."""
    return {PROGRESS_ENV: "1" if (stream or sys.stderr).isatty() else "0"}


class LocalLauncher:
    """Runs a stage command as a child process and waits for it."""

    def run(self, argv: list[str], env: Mapping[str, str], name: str, needs: Sequence[str] = ()) -> None:
        """Run `argv` with `env` added to this process's environment; raise StageFailed on a non-zero exit. `needs`: the
        modules it will import, which a warm interpreter imports first if it has not yet (`WarmServer.spawn`).

        Interrupted while it waits (Ctrl-C, Dagster's termination), it stops the stage in order first (SIGTERM, then
        SIGKILL after STOP_TIMEOUT_S; interrupted again meanwhile, at once), and the interruption goes on with what the stage
        said as a note.
        """
        with tempfile.TemporaryDirectory(prefix="factory-stage-") as scratch:
            error_file = Path(scratch) / "error"
            env = {**env, ERROR_FILE_ENV: str(error_file), RANK_LOGS_ENV: str(Path(scratch) / "ranks"), SCRATCH_ENV: scratch}
            full_env = {**progress_env(), **os.environ, **env}
            process = _start_warm(argv, full_env, [*env, PROGRESS_ENV], needs)
            if process is None:
                try:
                    process = subprocess.Popen(argv, env=full_env, stderr=subprocess.PIPE)
                except OSError as e:
                    raise LaunchError(f"cannot start stage {name!r} ({argv[0]}): {e}") from e
            tail = _Tail()
            pump = threading.Thread(target=_tee, args=(process.stderr, tail), daemon=True)
            pump.start()
            try:
                code = process.wait()
            except BaseException as stopped:
                try:
                    _stop(process)
                except BaseException:  # interrupted again while it stops: killed at once, and the first interruption goes on
                    process.kill()
                    process.wait()
                pump.join()
                stopped.add_note(f"{name}: {_said(error_file) or 'stopped'}")
                raise
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
                pump.join()
            if code != 0:
                said = _said(error_file)
                raise StageFailed(f"{name}: {said}" if said else f"stage {name!r} exited with code {code}{tail.explain()}")


def _stop(process: subprocess.Popen | WarmProcess) -> None:
    """Ask a stage to stop (SIGTERM: it unwinds, releasing its lease); kill it when it has not within STOP_TIMEOUT_S."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _said(error_file: Path) -> str:
    """The stage's own one-line error ('' when it wrote none: it crashed, or was not a factory stage)."""
    try:
        return error_file.read_text().strip()
    except FileNotFoundError:
        return ""


def run_captured(argv: list[str], env: Mapping[str, str], cwd: Path, launch_keys: Sequence[str] = (),
                 needs: Sequence[str] = ()) -> tuple[int, str]:
    """Run a stage command to its end in `cwd` with the environment `env` (the whole of it), its stdout dropped and its
    stderr kept rather than shown: (exit code, stderr). Inside `warm_starts` it is forked from the warm interpreter where
    that is what a cold start would be (`launch_keys`, `needs`: see `WarmServer.spawn`), else it starts cold."""
    with open(os.devnull, "wb") as devnull:
        process = _start_warm(argv, env, list(launch_keys), needs, cwd=cwd, stdout=devnull.fileno())
        if process is None:
            done = subprocess.run(argv, cwd=cwd, env=env, stdout=devnull, stderr=subprocess.PIPE)
            return done.returncode, done.stderr.decode(errors="replace")
        with process.stderr:
            try:
                said = process.stderr.read()
                return process.wait(), said.decode(errors="replace")
            finally:
                process.kill()  # interrupted while it ran: it ends with us, as a cold child of subprocess.run does


def _start_warm(argv: list[str], env: Mapping[str, str], launch_keys: list[str], needs: Sequence[str], cwd: Path | None = None,
                stdout: int = 1) -> WarmProcess | None:
    """The stage forked from the warm interpreter, or None (no warm block, or the interpreter refused; a refusal is said
    once per reason). A stage of several ranks forks with RANKS_MODULE in place of torchrun."""
    own = _kept if _blocks else None  # the interpreter of the `warm_starts` blocks this process is in
    server = own or _shared()
    if server is None:
        return None
    argv, needs = forking(argv, needs)
    launch_keys = [*launch_keys, *(name for name in {*env, *server.env} if UNREAD.fullmatch(name))]
    if server is not own:  # `factory ui`'s: the Dagster processes between it and us set variables of their own
        launch_keys = [*launch_keys, SHARED_SOCKET_ENV, *(name for name in env if DAGSTERS_OWN.fullmatch(name))]
    process = server.spawn(argv, env, launch_keys, needs, cwd, stdout)
    if process is None and server.refused and server.refused not in _told:
        _told.add(server.refused)
        print(f"note: stages start cold from here: {server.refused}", file=sys.stderr)
    return process


def forking(argv: Sequence[str], needs: Sequence[str]) -> tuple[list[str], list[str]]:
    """What a warm interpreter forks for `argv` and the modules it imports first: for torchrun, RANKS_MODULE in its place
    (its ranks then fork from it, with what the interpreter imported); any other command as it is."""
    if list(argv[1:3]) == ["-m", TORCHRUN]:
        return [argv[0], "-m", RANKS_MODULE, *argv[3:]], [*needs, *RANKS_NEEDS]
    return list(argv), list(needs)


_attached: WarmServer | None = None


def _shared() -> WarmServer | None:
    """The warm interpreter `factory ui` shares with the runs its daemon and UI launch (SHARED_SOCKET_ENV), if any."""
    global _attached
    path = os.environ.get(SHARED_SOCKET_ENV)
    if not path or sys.platform != "linux":
        return None
    if _attached is None or str(_attached.socket_path) != path:
        _attached = WarmServer.attach(Path(path))
    return _attached


class _Tail:
    """The last stderr lines of a stage, overall and per rank (under torchrun)."""

    def __init__(self) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self.ranks: dict[int, collections.deque[str]] = {}
        self.failed: int | None = None

    def add(self, line: str) -> None:
        line = line.rsplit("\r", 1)[-1]  # a redrawn progress line: only what is left on screen
        self.lines.append(line)
        if match := RANK_LINE.match(line):
            self.ranks.setdefault(int(match.group(1)), collections.deque(maxlen=STDERR_TAIL_LINES)).append(match.group(2))
        elif self.failed is None and (match := FAILED_RANK.search(line)):
            self.failed = int(match.group(1))

    def explain(self) -> str:
        """What to show of the output: the failing rank's last lines when torchrun named one, else the last lines."""
        if self.failed is not None and self.failed in self.ranks:
            return f"; rank {self.failed} failed first, its last lines:\n" + "".join(self.ranks[self.failed]).strip()
        return ":\n" + ("".join(self.lines).strip() or "(no output on stderr)")


def _tee(stream: IO[bytes], tail: _Tail) -> None:
    """Pass the child's stderr through as it comes (a progress bar redraws without newlines) and keep its last lines."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    partial = ""
    while chunk := os.read(stream.fileno(), 65536):
        text = decoder.decode(chunk)
        sys.stderr.write(text)
        sys.stderr.flush()
        *lines, partial = (partial + text).split("\n")
        for line in lines:
            tail.add(line + "\n")
        partial = partial.rsplit("\r", 1)[-1]
    if partial:
        tail.add(partial)
