"""Python's cycle collector paused for a bulk read that makes objects which all live on."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector paused for a bulk read: the rows of thousands of partitions, or of 100,000 manifests, make
    hundreds of thousands of dicts, lists and tuples that all live on, which its passes (one every 700 new ones) would walk
    again and again: a fifth of a read of 10,000 checkpoints' records, a quarter of `registry gc`'s dry run at 100,000
    manifests. What the read leaves behind is collected later, as usual."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
