"""Slots of a concurrency pool on this machine, held as file locks: at most `slots` stages of a pool run here at once.

Dagster's pools bound the steps of an instance, but the embedded (sqlite) instance claims a slot by reading a free
one and then writing its claim without checking that it is still free, so two runs that claim at the same moment
can both get the last slot. The local launcher therefore also holds one of the pool's slot files while a stage of
that pool runs. A lock belongs to the process holding it and goes with it, so a killed run never keeps a slot.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

POLL_S = 0.5


@contextlib.contextmanager
def pool_slot(directory: Path, pool: str, slots: int, on_wait: Callable[[list[str]], None], holder: str = "") -> Iterator[int]:
    """Hold one of the `slots` slots of `pool` (files under `directory/pool`) for the block; the slot's number. The slot's
    file says `holder` (who holds it, for those who wait) while it is held. `on_wait` is called once, with what the
    holders of every slot say, if every slot is taken when asked; then it waits for one to be given back."""
    folder = directory / pool
    folder.mkdir(parents=True, exist_ok=True)
    told = False
    while True:
        for number in range(max(slots, 1)):
            handle = os.open(folder / f"slot-{number}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(handle)
                continue
            try:
                os.ftruncate(handle, 0)
                os.pwrite(handle, holder.encode(), 0)
                yield number
            finally:
                os.ftruncate(handle, 0)  # while still held: the next holder writes its own
                os.close(handle)  # closing the last descriptor gives the lock back
            return
        if not told:
            on_wait(holders(folder, slots))
            told = True
        time.sleep(POLL_S)


def holders(folder: Path, slots: int) -> list[str]:
    """What the holders of a pool's slots wrote (a holder that wrote nothing: left out)."""
    said = []
    for number in range(max(slots, 1)):
        with contextlib.suppress(OSError):
            if text := (folder / f"slot-{number}.lock").read_text().strip():
                said.append(text)
    return said
