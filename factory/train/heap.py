"""Host memory between steps: keep what a step freed for the next step instead of handing it back to the OS.

A training step allocates and frees the same large buffers (activations, logits and their
gradients) every time. glibc's malloc returns a freed top of the heap to the OS once it passes
the trim threshold (by default twice the largest buffer freed so far, at most 64 MiB) and serves
buffers above the mmap threshold with fresh mappings, so each step faults its memory back in page
by page: on the CPU that costs a tenth of a step. Raising both thresholds keeps the peak resident
(it is reached again by the next step anyway).

Under FSDP that trade is the wrong one: each block's parameters are gathered into full-size buffers that are freed
after the block, so a heap that keeps them holds a whole model's worth of gathered blocks, undoing what sharding saves.
A sharded run maps every buffer over 1 MiB and unmaps it when freed instead (measured in `bench/fsdp.py`: peak memory
above the baseline 1.1-1.3x DDP's with the heap kept, 0.6x mapped).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
"""Buffers up to this size come from the heap (glibc's ceiling for the setting on 64-bit)."""
SHARDED_MMAP_THRESHOLD = 1 << 20
"""Under FSDP, buffers over this size are mapped, and handed back to the OS when freed."""
TRIM_THRESHOLD = 1 << 30
"""Free memory at the top of the heap is handed back to the OS only beyond this."""
_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")
LEAVE_ENV = "FACTORY_DEFAULT_MALLOC"
"""Set to 1 to leave glibc's malloc as it is (to compare, or where the resident peak matters more than speed)."""

_kept = False


def keep_freed_memory(sharded: bool = False) -> bool:
    """Raise glibc's trim and mmap thresholds for this process, once (no-op elsewhere, where the environment tunes malloc,
    or with FACTORY_DEFAULT_MALLOC=1); `sharded` (FSDP): map buffers over 1 MiB instead, and keep the default trim.
    Returns whether malloc was tuned."""
    global _kept
    if _kept or not sys.platform.startswith("linux") or os.environ.get(LEAVE_ENV) == "1" or any(name in os.environ for name in _ENV):
        return _kept
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if sharded:
        _kept = bool(mallopt(M_MMAP_THRESHOLD, SHARDED_MMAP_THRESHOLD))
    else:
        _kept = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _kept
