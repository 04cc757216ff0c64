"""Beside an in-process run (`factory run`): say who holds the slot a step waits for, stop at once when interrupted while
waiting, and give back what runs that died left in the instance's pools.

Dagster's executors wait for a pool's slot in a loop that spins without sleeping (the in-process one, of `factory run`, and
the multiprocess one, of the runs the daemon or the UI launch: a core burnt for as long as another run trains); the
in-process one also logs the wait only at DEBUG and never looks at the interrupt it captured (a SIGINT is held until the
next step starts, which a waiting step never does). A run killed while it waits keeps its entry in the pool's queue, which
is later given the slot for good: every later run waits behind a dead one. So each in-process run is tagged with its
process (`process_tags`), a thread watches the run while it goes (`RunWatch`), and every `factory run` first cancels the
runs of this machine whose process is gone and frees what any finished run still holds (`reap`). A step that joins a pool's
queue just as another run's step frees the pool's slot can be given the slot by nobody (`give_free_slots`): the executors'
wait, and every `factory run`, give such a slot.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.execution.plan.active import ActiveExecution
from dagster._core.execution.plan.step import ExecutionStep
from dagster._utils.interrupts import check_captured_interrupt

from assets.compute_logs import end_mirrors
from factory.errors import Interrupted

PID_TAG, HOST_TAG, START_TAG = "factory/pid", "factory/host", "factory/process-start"
"""Tags of an in-process run: the process that runs it, so that another process can tell whether it is still there."""
POLL_S = 0.25
"""How often the watch looks at the interrupt flag and an executor looks again at a slot it waits for."""
STUCK_S = 1.0
"""An interrupt no step picked up within this long came while the executor waits for a slot: the watch stops the run."""
QUEUE_CHECK_S = 1.0
"""How often the watch asks the instance whether the run waits for a slot."""
LIVE = [DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]


_steps_to_execute = ActiveExecution.get_steps_to_execute


def _steps_to_execute_or_wait(self: ActiveExecution, limit: int | None = None) -> Sequence[ExecutionStep]:
    """The steps that may start now; when none may, none is running and some wait for a pool's slot, returned after POLL_S
    (and, every QUEUE_CHECK_S, a slot nobody was given is given: `give_free_slots`). Both executors ask again at once
    otherwise: Dagster's own wait between checks is never above 0 (the in-process executor sleeps for
    `interval_to_next_pending_claim_check`, the multiprocess one not at all)."""
    steps = _steps_to_execute(self, limit)
    pools = self._instance_concurrency_context
    if not steps and not self._in_flight and pools is not None and pools.has_pending_claims():
        global _given_at
        if time.monotonic() - _given_at >= QUEUE_CHECK_S:
            _given_at = time.monotonic()
            give_free_slots(pools._instance)
        time.sleep(POLL_S)
    return steps


_given_at = 0.0
"""When this process last gave free slots to waiting steps."""


def give_free_slots(instance: DagsterInstance) -> list[str]:
    """Give each pool's free slots to the steps in its queue that wait with none given; one line per pool set right.

    Dagster gives a slot to a waiting step only as another step frees one, and decides whether a step that joins the queue
    gets a free slot before it joins: a slot freed in between (a step of another run ends just as this one joins) is given
    to nobody, and the step that joined waits for good, with the slot free beside it. Giving one too many is harmless: a
    slot is claimed in the storage, one step at a time, and a step given none yet waits for the next."""
    storage, said = instance.event_log_storage, []
    if not storage.supports_global_concurrency_limits:
        return said
    for pool in storage.get_concurrency_keys():
        info = storage.get_concurrency_info(pool)
        given = sum(step.assigned_timestamp is not None for step in info.pending_steps)
        waiting = sum(step.assigned_timestamp is None for step in info.pending_steps)
        free = min(info.slot_count - given, waiting)
        if free > 0:
            storage.assign_pending_steps([pool] * free)
            said.append(f"gave {free} free slot{'s' if free > 1 else ''} of pool {pool} to the steps waiting for {'them' if free > 1 else 'it'}")
    return said


ActiveExecution.get_steps_to_execute = _steps_to_execute_or_wait


def process_tags() -> dict[str, str]:
    """The tags that name this process as the one running an in-process run."""
    return {PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname(), START_TAG: _started(os.getpid())}


def _started(pid: int) -> str:
    """When process `pid` started (clock ticks since boot: with the pid, one process for good); "" when there is none, or
    when it has ended and only waits to be reaped (a zombie: a process killed with its parent waits for init, seconds under
    load, and a run that took it for alive would wait behind the dead run's place in the pool's queue for good)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    state, *rest = stat[stat.rindex(")") + 2 :].split()
    return "" if state == "Z" else rest[18]


def _gone(tags: dict[str, str]) -> bool:
    """Whether the process named by an in-process run's tags has ended (False when it ran on another machine)."""
    if tags.get(HOST_TAG) != socket.gethostname() or not tags.get(PID_TAG, "").isdigit():
        return False
    return _started(int(tags[PID_TAG])) != tags.get(START_TAG)


def reap(instance: DagsterInstance) -> list[str]:
    """Cancel this machine's in-process runs whose process is gone, and free every pool slot and queue entry held by a run
    that is over or unknown; one line per run set right."""
    said, storage = [], instance.event_log_storage
    pooled = storage.supports_global_concurrency_limits
    for run in instance.get_runs(filters=RunsFilter(statuses=LIVE, tags={HOST_TAG: socket.gethostname()})):
        if _gone(run.tags):
            cancel(instance, run.run_id, f"its process ({run.tags[PID_TAG]}) ended without finishing the run")
            said.append(f"run {run.run_id[:8]} of {describe(run.tags)} was left running by a process that is gone: canceled")
    if not pooled:
        return said
    held = set()
    for pool in storage.get_concurrency_keys():
        info = storage.get_concurrency_info(pool)
        held |= {slot.run_id for slot in info.claimed_slots} | {step.run_id for step in info.pending_steps}
    for run_id in held:
        run = instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            storage.free_concurrency_slots_for_run(run_id)
            said.append(f"freed the pool slots run {run_id[:8]} still held ({'gone' if run is None else run.status.value.lower()})")
    return said + give_free_slots(instance)


def describe(tags: dict[str, str]) -> str:
    """A run, as a person knows it: its experiment (or partition)."""
    return tags.get("experiment") or tags.get("dagster/partition") or "another run"


def waiting_steps(instance: DagsterInstance, run_id: str) -> dict[tuple[str, str], str]:
    """(step, pool) -> who holds the pool's slots, for each step of run `run_id` in a pool's queue."""
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return {}
    waiting = {}
    for pool in storage.get_concurrency_keys():
        info = storage.get_concurrency_info(pool)
        for step in info.pending_steps:
            if step.run_id == run_id and step.assigned_timestamp is None:
                waiting[step.step_key, pool] = ", ".join(sorted({_holder(instance, slot.run_id) for slot in info.claimed_slots})) or "nobody yet"
    return waiting


def _holder(instance: DagsterInstance, run_id: str) -> str:
    run = instance.get_run_by_id(run_id)
    return f"{describe(run.tags)} (run {run_id[:8]})" if run is not None else f"run {run_id[:8]}"


@contextlib.contextmanager
def watching(run_id: str) -> Iterator[None]:
    """Within the block, the process's watch (if one is open) watches run `run_id`."""
    watch = RunWatch.active
    if watch is None:
        yield
        return
    watch.run_id = run_id
    try:
        yield
    finally:
        watch.run_id = None


def cancel(instance: DagsterInstance, run_id: str, message: str) -> None:
    """Mark run `run_id` canceled (whatever it said as it stopped) and give back every slot and queue entry it held."""
    run = instance.get_run_by_id(run_id)
    if run is not None and run.status != DagsterRunStatus.CANCELED:
        instance.report_run_canceled(run, message=message)
    if instance.event_log_storage.supports_global_concurrency_limits:
        instance.event_log_storage.free_concurrency_slots_for_run(run_id)


class RunWatch:
    """Watches the in-process run of the moment (`watching`) from a thread of its own: says when one of its steps waits for
    a pool's slot and who holds it (on the terminal and in the run's log), and when an interrupt came while it waits, cancels
    the run, calls `on_stopped` (it says how to go on) and ends the process with exit status 130."""

    active: RunWatch | None = None
    """The watch of this process, while one is open."""

    def __init__(self, instance: DagsterInstance, on_stopped: Callable[[str], None]) -> None:
        self.instance = instance
        self.on_stopped = on_stopped
        self.run_id: str | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="factory-run-watch", daemon=True)

    def __enter__(self) -> RunWatch:
        self.thread.start()
        RunWatch.active = self
        return self

    def __exit__(self, *exc: object) -> None:
        RunWatch.active = None
        self.done.set()
        self.thread.join()

    def _watch(self) -> None:
        told: dict[tuple[str, str], str] = {}
        interrupted_at, checked_at = None, 0.0
        while not self.done.wait(POLL_S):
            run_id, now = self.run_id, time.monotonic()
            if run_id is None:
                told, interrupted_at = {}, None
                continue
            interrupted_at = (interrupted_at or now) if check_captured_interrupt() else None
            if now - checked_at >= QUEUE_CHECK_S or interrupted_at is not None:
                checked_at, waiting = now, waiting_steps(self.instance, run_id)
                for (step, pool), holders in waiting.items():
                    if told.get((step, pool)) != holders:
                        self._say(run_id, step, f"{step}: waiting for a slot of pool {pool}, held by {holders}")
                told = waiting
                if interrupted_at is not None and now - interrupted_at >= STUCK_S and waiting:
                    self._stop(run_id, ", ".join(sorted(f"{step} (pool {pool})" for step, pool in waiting)))

    def _say(self, run_id: str, step: str, message: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)
        run = self.instance.get_run_by_id(run_id)
        if run is not None:
            self.instance.report_engine_event(message, dagster_run=run, step_key=step)

    def _stop(self, run_id: str, where: str) -> None:
        said = f"interrupted while waiting for a slot: {where}"
        cancel(self.instance, run_id, said)
        end_mirrors()  # the run's output captured by the instance's compute logs is on the terminal before the last word
        self.on_stopped(said)
        sys.stderr.flush()
        os._exit(Interrupted.exit_code)  # the main thread is inside Dagster's executor, which would wait on: nothing else runs now
