"""Where the data stages' engine runs: Daft's native runner on every core of this machine, or Daft's Ray runner on the
Ray cluster `$FACTORY_RAY_ADDRESS` names (the cluster profile's `ray.address`, which the launcher puts in each stage's
environment). A stage's code is the same on both: it calls `use_engine` once, before its first dataframe.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Mapping

from factory.config.cluster import RAY_ADDRESS_ENV, ray_unreachable
from factory.errors import StageFailed

os.environ.setdefault("DAFT_ANALYTICS_ENABLED", "0")  # Daft reports each import and run over the network unless told not to
os.environ.setdefault("DAFT_PROGRESS_BAR", "0")  # the stages report progress themselves (factory.runtime.progress)

_chosen: tuple[str, str] | None = None
"""The Ray address this process's engine was set for ("": none) and what it is (Daft's runner is set once per process)."""
CONNECT_TRIES = 3
"""Connections to a Ray cluster a stage tries before it fails (`_connected`)."""
RAY_IN_FLIGHT = 8
"""Pieces of work a stage keeps on a Ray cluster at once: each holds its documents in this process until it is back."""


def use_engine(log: logging.Logger, environ: Mapping[str, str] = os.environ) -> str:
    """Set Daft's runner for this process from `environ` (once; later calls say what was chosen) and say which it is."""
    global _chosen
    address = environ.get(RAY_ADDRESS_ENV, "").strip()
    if _chosen is not None and _chosen[0] == address:
        return _chosen[1]
    if not address:
        _native()
        chosen = f"Daft's native runner on this machine's {os.cpu_count()} cores"
    else:
        chosen = f"Daft's Ray runner on the Ray cluster at {address} ({_cpus(_connected(address))} CPUs)"
    _chosen = (address, chosen)
    log.info("data engine: %s", chosen)
    return chosen


def _native() -> None:
    """Daft's native runner, set before Daft picks one: picking, it imports Ray to see whether this process runs in a Ray
    job (half a second of CPU at the start of every data stage). A runner this process set before stays, and so does
    one `$DAFT_RUNNER` names."""
    if os.environ.get("DAFT_RUNNER"):
        return
    import daft
    from daft.exceptions import DaftCoreException

    with contextlib.suppress(DaftCoreException):  # "Cannot set runner more than once"
        daft.set_runner_native()


def on_ray() -> bool:
    """Whether this process's engine runs on a Ray cluster (`use_engine` chose it)."""
    return _chosen is not None and bool(_chosen[0])


def in_flight() -> int:
    """How many independent pieces of work (a chunk of documents to sign) a stage keeps going at once: on this machine,
    one a core it may run on (a container's CPU set, not the host's); on a Ray cluster, RAY_IN_FLIGHT."""
    if on_ray():
        return RAY_IN_FLIGHT
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _connected(address: str) -> object:
    """Ray, connected to the cluster at `address` (without forwarding its workers' output to this process's terminal), with
    Daft's Ray runner set and its plan runner started on the cluster (a query of one row, before the chunks a stage
    signs at once ask for it from several threads). A connection that fails is tried again, up to CONNECT_TRIES times:
    Ray Client's proxy (`ray://`) at times fails to start the server it gives a new client."""
    if (reason := ray_unreachable(address)) is not None:
        raise StageFailed(f"no Ray cluster answers at {address} ({RAY_ADDRESS_ENV}, the cluster profile's ray.address): {reason}")
    import daft
    import ray

    attempt = 1
    while True:
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
            break
        except Exception as e:  # Ray's errors (ConnectionError, its own) say what failed; the stage says where it was told to go
            with contextlib.suppress(Exception):
                ray.shutdown()
            if not isinstance(e, ConnectionError) or attempt == CONNECT_TRIES:
                raise _cannot_run(address, e, attempt) from None
            logging.getLogger(__name__).warning("connecting to the Ray cluster at %s failed (%s); trying again", address, _said(e))
            attempt += 1
            time.sleep(1)
    try:
        daft.set_runner_ray(noop_if_initialized=True)
        daft.from_pydict({"ready": [1]}).sum("ready").to_pydict()  # a plan to run (a dataframe of data alone has none)
    except Exception as e:
        raise _cannot_run(address, e, 1) from None
    return ray


def _cannot_run(address: str, error: Exception, tries: int) -> StageFailed:
    tried = f" (tried {tries} times)" if tries > 1 else ""
    return StageFailed(f"cannot run on the Ray cluster at {address} ({RAY_ADDRESS_ENV}, the cluster profile's ray.address){tried}: "
                       f"{_said(error)}")


def _said(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else 'no reason given'}"


def _cpus(ray: object) -> int:
    return int(ray.cluster_resources().get("CPU", 0))  # type: ignore[attr-defined]
