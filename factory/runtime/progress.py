"""A live progress bar for a training stage whose output ends on a terminal; nothing elsewhere (CI keeps plain logs)."""

from __future__ import annotations

import contextlib
import math
import os
import sys
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
