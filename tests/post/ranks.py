"""Real torch.distributed worlds for tests: processes that meet over gloo through a store the test hosts."""

import contextlib
import multiprocessing
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def spawned(target: Callable, args: tuple, nprocs: int, timeout_s: float) -> Iterator[None]:
    """Run `target(rank, store_port, *args)` in `nprocs` processes while the block runs; wait for them at its end.

    The store is up before any rank starts (a rank that finds none backs off for seconds before
    retrying). A rank that raises fails the test with its traceback; ranks still running after
    `timeout_s` (a stuck collective) are killed and fail it too.
    """
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(REPO))  # spawned children import the test module by its name
        # forked from multiprocessing's fork server, which imported the first target's module (torch, the factory)
        # once: started fresh, each rank would import it all again (two to three seconds a rank). The fork server is a
        # process of its own, started once per test process (the preload counts then only) in its environment then,
        # and it never computes (a fork of a process that ran torch in parallel would hang)
        multiprocessing.set_forkserver_preload([target.__module__])
        processes = mp.start_processes(target, args=(store.port, *args), nprocs=nprocs, join=False, start_method="forkserver")
        yield
        deadline = time.monotonic() + timeout_s
        while not processes.join(timeout=1.0):  # raises with the child's traceback when a rank fails
            if time.monotonic() > deadline:
                for process in processes.processes:
                    process.kill()
                pytest.fail(f"ranks still running after {timeout_s} s: a collective is stuck")
