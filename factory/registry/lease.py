"""Leases: the first process to ask for a stage computes it; the others wait and then reuse it.

A lease is a small file in the registry (so it works on shared storage too) created with
O_EXCL. Its holder touches it every `heartbeat_s`; a lease not touched for `stale_after_s` is
taken over (its holder died), and so is one whose holder process is gone from this machine. Two waiters that see the same stale lease at the same instant can
both take it over; that costs one duplicate computation, never a wrong artifact, because
publishing is content-addressed and the first manifest for a fingerprint stands.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

LEASE_STALE_S = 120.0
LEASE_HEARTBEAT_S = 10.0
LEASE_POLL_S = 0.5


@dataclass(frozen=True, kw_only=True, slots=True)
class Holder:
    """Who holds a lease, and how long ago it last proved it was alive."""

    owner: str
    token: str
    host: str
    pid: int
    age_s: float


def read_holder(path: Path) -> Holder | None:
    """The current holder of the lease at `path`, or None when nobody holds it."""
    try:
        age = time.time() - path.stat().st_mtime
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return Holder(owner=data["owner"], token=data["token"], host=data["host"], pid=data["pid"], age_s=max(0.0, age))


@contextlib.contextmanager
def hold(
    path: Path,
    owner: str,
    *,
    on_wait: Callable[[Holder], None] | None = None,
    on_takeover: Callable[[Holder], None] | None = None,
    stale_after_s: float = LEASE_STALE_S,
    heartbeat_s: float = LEASE_HEARTBEAT_S,
    poll_s: float = LEASE_POLL_S,
) -> Iterator[None]:
    """Block until this process holds the lease at `path`; keep it alive until the block ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    announced = False
    while not _try_create(path, owner, token):
        holder = read_holder(path)
        if holder is None:
            continue  # released between our attempt and our look: try again at once
        if abandoned(holder, stale_after_s) is not None:
            if on_takeover:
                on_takeover(holder)
            _remove_if_token(path, holder.token)
            continue
        if on_wait and not announced:
            on_wait(holder)
            announced = True
        time.sleep(poll_s)
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(path, token, stop, heartbeat_s), daemon=True)
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join()
        _remove_if_token(path, token)


def abandoned(holder: Holder, stale_after_s: float = LEASE_STALE_S) -> str | None:
    """Why nobody is computing under `holder`'s lease any more (its process is gone from this machine, or it went
    silent), or None while it may still be."""
    if holder.host == socket.gethostname() and holder.pid != os.getpid():
        try:
            os.kill(holder.pid, 0)
        except ProcessLookupError:
            return f"pid {holder.pid} is gone"
        except PermissionError:
            pass  # alive, owned by someone else
    if holder.age_s > stale_after_s:
        return f"silent for {holder.age_s:.0f} s"
    return None


def _try_create(path: Path, owner: str, token: str) -> bool:
    record = json.dumps({"owner": owner, "token": token, "host": socket.gethostname(), "pid": os.getpid()})
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(record)
        f.flush()
        os.fsync(f.fileno())
    return True


def _heartbeat(path: Path, token: str, stop: threading.Event, interval_s: float) -> None:
    while not stop.wait(interval_s):
        holder = read_holder(path)
        if holder is None or holder.token != token:
            return  # taken over: it is no longer ours to keep alive
        with contextlib.suppress(FileNotFoundError):
            os.utime(path)


def _remove_if_token(path: Path, token: str) -> None:
    """Remove the lease only if it is the one we saw (never someone else's fresh lease)."""
    aside = path.with_name(f"{path.name}.{uuid.uuid4().hex}.released")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    holder = read_holder(aside)
    if holder is None or holder.token == token:
        aside.unlink(missing_ok=True)
        return
    try:
        os.link(aside, path)  # it was someone else's: put it back unless a newer one appeared
    except FileExistsError:
        pass
    aside.unlink(missing_ok=True)
