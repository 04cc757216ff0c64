"""Live progress bars for stages whose output ends on a terminal (nothing elsewhere: CI keeps plain logs), and progress
lines in a stage's log for work done in parts."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import IO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from factory.launch.local import PROGRESS_ENV

StepSink = Callable[[int, float, float], None]
"""(steps done, loss, tokens per second)."""


def wants_progress(world_size: int) -> bool:
    """Whether the launcher says stderr is a terminal (one rank only: torchrun prefixes and buffers each rank's lines)."""
    return os.environ.get(PROGRESS_ENV) == "1" and world_size == 1


@contextlib.contextmanager
def training_progress(name: str, total: int, enabled: bool, file: IO[str] | None = None) -> Iterator[StepSink | None]:
    """A bar with step, loss and tokens/s, updated by the sink it yields (None when not enabled)."""
    if not enabled:
        yield None
        return
    console = Console(file=file or sys.stderr, force_terminal=True)
    columns = (
        TextColumn(name), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[speed]} tok/s"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, refresh_per_second=4) as progress:
        task = progress.add_task(name, total=total, loss="-", speed="-")

        def update(step: int, loss: float, tokens_per_second: float) -> None:
            shown = f"{loss:.4f}" if math.isfinite(loss) else str(loss)
            progress.update(task, completed=step, loss=shown, speed=f"{tokens_per_second:,.0f}")

        yield update


PartSink = Callable[[int, int], None]
"""(units done, units in all): called as each part of a stage's work ends."""
LOG_EVERY_S = 10.0
"""A stage's log says how far its work is at most this often (and at its end): a line per part of a large corpus would
drown the run's event log."""


@contextlib.contextmanager
def work_progress(name: str, unit: str, log: logging.Logger, enabled: bool, every_s: float = LOG_EVERY_S,
                  file: IO[str] | None = None) -> Iterator[PartSink]:
    """How far a stage's work in parts is (a dataset's files, dedup's partitions of documents): a line of its log when a
    part ends, at most every `every_s` seconds and always at the last, and a live bar where `enabled` (a terminal)."""
    said = [-math.inf]
    with contextlib.ExitStack() as stack:
        bar: Callable[[int, int], None] | None = None
        if enabled:
            progress = stack.enter_context(Progress(TextColumn(name), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
                                                    TimeRemainingColumn(), console=Console(file=file or sys.stderr, force_terminal=True),
                                                    refresh_per_second=4))
            task = progress.add_task(name, total=None)

            def bar(done: int, total: int) -> None:
                progress.update(task, completed=done, total=total)

        def part_done(done: int, total: int) -> None:
            if bar is not None:
                bar(done, total)
            now = time.monotonic()
            if done >= total or now - said[0] >= every_s:
                said[0] = now
                log.info("%s: %d of %d %s (%.0f%%)", name, done, total, unit, 100 * done / max(total, 1))

        yield part_done
