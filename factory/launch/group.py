"""A command in a process group of its own, stopped whole: every process it started, however deep.

`factory run` and `factory ui` start Dagster this way. A terminal's Ctrl-C (or a SIGTERM) then
reaches only the `factory` process, which passes one interrupt to the command and lets it shut
down in order: a run stops its stage, which releases its lease and says where it stopped;
`dagster dev` stops its webserver and daemon. Whatever of the group is left after STOP_TIMEOUT_S
(code servers, run workers and the stages they launched: Dagster starts them all in the group it
was started in) gets SIGTERM, then SIGKILL after KILL_AFTER_S. A second signal skips the waits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from factory.errors import Interrupted

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_TIMEOUT_S = 60.0
"""How long the command may take to shut down in order after its interrupt (a stage unwinds, Dagster records the run)."""
KILL_AFTER_S = 10.0
"""How long what is left of the group has between SIGTERM and SIGKILL."""
POLL_S = 0.1


@dataclass(frozen=True, kw_only=True, slots=True)
class Ended:
    """How a command run by `run_group` ended."""

    code: int
    """Its exit code (130, as for any interrupted command, when a second signal killed it)."""
    signals: int
    """How many stop signals this process got meanwhile: 0 it ended on its own, 1 it was stopped in order, 2 killed."""


def run_group(argv: Sequence[str], env: Mapping[str, str]) -> Ended:
    """Run `argv` in a session of its own until it ends; SIGINT, SIGTERM or SIGHUP to this process stop its whole group
    (a second one kills it at once)."""
    signals: list[int] = []

    def heard(signum: int, frame: FrameType | None) -> None:
        signals.append(signum)

    previous = {number: signal.signal(number, heard) for number in STOP_SIGNALS}
    try:
        process = subprocess.Popen(list(argv), env=dict(env), start_new_session=True)
        while process.poll() is None and not signals:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=POLL_S)
        # Stopped or not, nothing it started outlives it.
        stop_group(process.pid, lambda: len(signals) < 2, leader=process if signals else None)
        killed = len(signals) > 1
        return Ended(code=Interrupted.exit_code if killed else process.wait(), signals=min(len(signals), 2))
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def stop_group(group: int, patient: Callable[[], bool], leader: subprocess.Popen | None = None) -> None:
    """Stop process group `group`: SIGINT to its `leader` (when given) and up to STOP_TIMEOUT_S for it to end in order,
    then SIGTERM to every process left in the group and SIGKILL after KILL_AFTER_S. `patient()` False skips the waits."""
    if leader is not None and leader.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            leader.send_signal(signal.SIGINT)
        _wait_until(lambda: leader.poll() is not None, STOP_TIMEOUT_S, patient)
    if members(group):
        _signal_group(group, signal.SIGTERM)
        _wait_until(lambda: not members(group), KILL_AFTER_S, patient)
    if members(group):
        _signal_group(group, signal.SIGKILL)
        _wait_until(lambda: not members(group), KILL_AFTER_S, lambda: True)
    if leader is not None:
        leader.wait()


def members(group: int) -> list[int]:
    """The live processes of process group `group` (zombies, already dead, left out)."""
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: whether the group has any process at all
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [group]
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it ended while we looked
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (command)": state, ppid, pgrp, ...
        if int(fields[2]) == group and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _signal_group(group: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, number)


def _wait_until(done: Callable[[], bool], timeout_s: float, patient: Callable[[], bool]) -> None:
    deadline = time.monotonic() + timeout_s
    while not done() and patient() and time.monotonic() < deadline:
        time.sleep(POLL_S)
