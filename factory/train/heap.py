"""Host memory between steps: keep what a step freed for the next step instead of handing it back to the OS.

A training step allocates and frees the same large buffers (activations, logits and their
gradients) every time. glibc's malloc returns a freed top of the heap to the OS once it passes
the trim threshold (by default twice the largest buffer freed so far, at most 64 MiB) and serves
buffers above the mmap threshold with fresh mappings, so each step faults its memory back in page
by page: on the CPU that costs a tenth of a step. Raising both thresholds, and padding the heap's growth so that
buffers just above the mmap threshold fit in its free top (`TOP_PAD`), keeps the peak resident (it is reached again by
the next step anyway). An evaluation batch's benchmarks allocate and free the same logits batch after batch too, and
keep their memory the same way; buffers of up to the pad (a checkpoint's tensors, loaded for scoring) then come from the
heap as well, and stay resident until the process ends or the trim threshold is passed.

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
M_TOP_PAD = -2
TOP_PAD = 256 << 20
"""Each time the heap grows, it grows by this much more than asked (address space: pages are resident once used). A
buffer above the mmap threshold is taken from the heap's free top when the top has room for it, and is mapped afresh
(and faulted in again) only when it has not: the logits of an evaluation batch of the tiny experiment (32 windows of 128
tokens over 2,048 entries, in fp32: 32 MiB and torch's alignment) fit in this pad, not in glibc's default of 128 KiB."""
_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")
LEAVE_ENV = "FACTORY_DEFAULT_MALLOC"
"""Set to 1 to leave glibc's malloc as it is (to compare, or where the resident peak matters more than speed)."""

_kept = False


def keep_freed_memory(sharded: bool = False) -> bool:
    """Raise glibc's trim and mmap thresholds and its top pad for this process, once (no-op elsewhere, where the
    environment tunes malloc, or with FACTORY_DEFAULT_MALLOC=1); `sharded` (FSDP): map buffers over 1 MiB instead, and
    keep the default trim and pad. Returns whether malloc was tuned."""
    global _kept
    if _kept or not sys.platform.startswith("linux") or os.environ.get(LEAVE_ENV) == "1" or any(name in os.environ for name in _ENV):
        return _kept
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt, malloc, free = libc.mallopt, libc.malloc, libc.free
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    malloc.argtypes, malloc.restype, free.argtypes, free.restype = [ctypes.c_size_t], ctypes.c_void_p, [ctypes.c_void_p], None
    if sharded:
        _kept = bool(mallopt(M_MMAP_THRESHOLD, SHARDED_MMAP_THRESHOLD))
    else:
        _kept = all(mallopt(option, value) for option, value in ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                                                                 (M_TOP_PAD, TOP_PAD)))
        if _kept:  # the heap grows now, by its pad: the first large buffer finds its free top (untouched: not resident)
            free(malloc(MMAP_THRESHOLD // 2))
    return _kept
