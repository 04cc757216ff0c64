"""Leases: the first process to ask for a stage computes it; the others wait and then reuse it.

A lease is a small file in the registry (so it works on shared storage too), created whole with
a hard link (never seen empty). Its holder writes a fresh `beat` (its clock) into it every
`heartbeat_s`; a lease whose beat is older than `stale_after_s` is taken over (its holder died),
and so is one whose holder process is gone from this machine. Two waiters that see the same stale
lease at the same instant can both take it over; that costs one duplicate computation, never a
wrong artifact, because publishing is content-addressed and the first manifest for a fingerprint
stands.

Clocks differ on shared storage, so the age of a lease is judged on the reader's clock too: a
beat from the future counts as "now", and a beat (or an unreadable file: empty after a crash or a
full disk, garbage, keys missing) that has not changed since this process first saw it is at least
as old as that sighting. So a skewed holder that stops beating, and a lease nobody can read, are
taken over `stale_after_s` after this reader last saw them change.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from factory.atomic import synced_temp
from factory.registry.files import DIGEST, load_record

LEASE_STALE_S = 120.0
LEASE_HEARTBEAT_S = 10.0
LEASE_POLL_S = 0.5
LEASE_KEYS = {"owner": str, "token": str, "host": str, "pid": int, "beat": (int, float)}
LEASE_BYTES = 64 << 10
"""A lease is a line of JSON: anything larger is damage."""
MAX_PID = 1 << 31
"""Above any process id a kernel gives (Linux's pid_max is at most 2^22)."""

log = logging.getLogger(__name__)
_first_seen: dict[str, tuple[tuple[Any, ...], float]] = {}
_warned: set[str] = set()


@dataclass(frozen=True, kw_only=True, slots=True)
class Holder:
    """Who holds a lease, and how long ago it last proved it was alive."""

    owner: str
    token: str
    host: str
    pid: int
    age_s: float
    damage: str = ""
    """Why the lease file could not be read ("" when it could); such a lease has no holder to ask."""
    needs: tuple[str, ...] = ()
    """The digests of the artifacts its holder reads while it computes (its stage's inputs): `factory registry gc` keeps
    them while the lease is alive."""


class LeaseBusy(Exception):
    """A lease asked for without waiting is held by someone alive."""

    def __init__(self, holder: Holder) -> None:
        super().__init__(f"{holder.owner} holds it")
        self.holder = holder


def read_holder(path: Path) -> Holder | None:
    """The current holder of the lease at `path`, or None when nobody holds it.

    A lease that cannot be read is a holder with `damage` set (and a warning, once per file), aged by the file."""
    loaded = _load(path)
    return None if loaded is None else holder_of(str(path), *loaded)


def holder_of(where: str, data: dict[str, Any], token: str, damage: str, claimed_s: float) -> Holder:
    """The holder a lease record names (`where` it was read, for the warning about damage and for its age)."""
    if damage:
        if where not in _warned:
            _warned.add(where)
            log.warning("lease %s cannot be read (%s); it is taken over once it stays unchanged past the lease timeout", where, damage)
        age = _age(where, (token,), claimed_s)
        return Holder(owner=f"an unreadable lease ({damage})", token=token, host="", pid=0, age_s=age, damage=damage)
    age = _age(where, (token, data["beat"]), claimed_s)
    needs = data.get("needs")
    needs = tuple(n for n in needs if isinstance(n, str) and DIGEST.fullmatch(n)) if isinstance(needs, list) else ()
    return Holder(owner=data["owner"], token=token, host=data["host"], pid=data["pid"], age_s=age, needs=needs)


def parse_lease(data: Any) -> float:
    """The beat of a parsed lease record (its holder's clock when it last proved alive); ValueError (or OverflowError,
    for a beat of hundreds of digits) when the record is not one the factory writes."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if bad := [k for k, kind in LEASE_KEYS.items() if not isinstance(data.get(k), kind)]:
        raise ValueError(f"missing or wrong: {', '.join(bad)}")
    if type(data["pid"]) is not int or not 0 < data["pid"] < MAX_PID:
        raise ValueError(f"pid {str(data['pid'])[:24]} is no process id")
    if not math.isfinite(beat := float(data["beat"])):
        raise ValueError("beat is not a time")
    return beat


def _load(path: Path) -> tuple[dict[str, Any], str, str, float] | None:
    """(record, token, damage, claimed age) of the lease file, or None when there is none. An unreadable file's
    token names the file itself (inode, mtime, size), and its claimed age is its mtime's."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    unreadable = f"unreadable:{info.st_ino}:{info.st_mtime_ns}:{info.st_size}"
    try:
        data = load_record(path, LEASE_BYTES)
        beat = parse_lease(data)
    except FileNotFoundError:
        return None
    except OSError as e:  # no permission to read it, or not a regular file: nobody can tell who holds it
        return {}, unreadable, e.strerror or str(e), time.time() - info.st_mtime
    except (ValueError, OverflowError) as e:
        damage = "empty" if info.st_size == 0 else str(e)
        return {}, unreadable, damage, time.time() - info.st_mtime
    return data, data["token"], "", time.time() - beat


def _age(where: str, seen: tuple[Any, ...], claimed_s: float) -> float:
    """The age a lease claims, at least 0 (a beat from the future is "now") and at least the time since this
    process first saw it in this state (so a frozen future beat still ages on the reader's clock)."""
    now = time.monotonic()
    first = _first_seen.get(where)
    if first is None or first[0] != seen:
        _first_seen[where] = (seen, now)
        return max(0.0, claimed_s)
    return max(0.0, claimed_s, now - first[1])


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
    needs: Iterable[str] = (),
    wait: bool = True,
) -> Iterator[None]:
    """Block until this process holds the lease at `path`; keep it alive until the block ends. `needs`: the digests its
    holder reads meanwhile (`Holder.needs`). With `wait=False`, LeaseBusy instead of waiting for a holder alive."""
    path.parent.mkdir(parents=True, exist_ok=True)
    needs = tuple(needs)
    token = uuid.uuid4().hex
    announced = retried = False
    busy: Holder | None = None
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(path, owner, token, stop, heartbeat_s, needs), daemon=True)
    try:  # from the first try on: an interrupt between creating the file and holding it must not leave it behind
        while not _try_create(path, record(owner, token, needs)):
            holder, why = read_holder(path), None
            if holder is not None and (why := abandoned(holder, stale_after_s)) is not None:
                if holder.damage:
                    log.warning("taking over lease %s: %s", path, why)
                if on_takeover:
                    on_takeover(holder)
                _remove_if_token(path, holder.token)
            elif holder is not None and not wait:
                busy = holder  # never created: nothing of ours to remove
                raise LeaseBusy(holder)
            elif holder is not None and on_wait and not announced:
                on_wait(holder)
                announced = True
            if (holder is None or why is not None) and not retried:
                retried = True  # released or taken over a moment ago: try once more at once
                continue
            retried = False
            time.sleep(poll_s)  # never spin, whatever the lease file holds
        beat.start()
        yield
    finally:
        stop.set()
        try:
            _join_uninterrupted(beat)  # a beat being written would otherwise put the lease back after the removal below
        finally:
            if busy is None:
                _remove_if_token(path, token)  # only a lease of this token: another's stays


def _join_uninterrupted(thread: threading.Thread) -> None:
    """Wait for `thread` (if it was started) even when a Ctrl-C or SIGTERM lands meanwhile; the interrupt is raised once it
    has ended."""
    interrupted: KeyboardInterrupt | None = None
    while thread.is_alive():
        try:
            thread.join()
        except KeyboardInterrupt as e:
            interrupted = e
    if interrupted is not None:
        raise interrupted


def abandoned(holder: Holder, stale_after_s: float = LEASE_STALE_S) -> str | None:
    """Why nobody is computing under `holder`'s lease any more (its process is gone from this machine, it went
    silent, or its lease has been unreadable too long), or None while it may still be."""
    if holder.host == socket.gethostname() and holder.pid != os.getpid():
        try:
            os.kill(holder.pid, 0)
        except ProcessLookupError:
            return f"pid {holder.pid} is gone"
        except PermissionError:
            pass  # alive, owned by someone else
    if holder.age_s > stale_after_s:
        return f"unreadable ({holder.damage}) for {holder.age_s:.0f} s" if holder.damage else f"silent for {holder.age_s:.0f} s"
    return None


def record(owner: str, token: str, needs: tuple[str, ...] = ()) -> bytes:
    """A lease record: who holds it, on which machine, its beat (now, on this clock), and what it reads (when it says)."""
    fields = {"owner": owner, "token": token, "host": socket.gethostname(), "pid": os.getpid(), "beat": time.time()}
    return json.dumps(fields | ({"needs": list(needs)} if needs else {})).encode()


def _try_create(path: Path, content: bytes) -> bool:
    """Create the lease with its content in one step (a link never replaces), so no reader sees it empty."""
    with synced_temp(path, content, mode=0o600) as tmp:
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
    return True


def _heartbeat(path: Path, owner: str, token: str, stop: threading.Event, interval_s: float, needs: tuple[str, ...] = ()) -> None:
    while not stop.wait(interval_s):
        holder = read_holder(path)
        if holder is None or holder.token != token:
            return  # taken over: it is no longer ours to keep alive
        with synced_temp(path, record(owner, token, needs), mode=0o600) as tmp:
            os.replace(tmp, path)


def _remove_if_token(path: Path, token: str) -> None:
    """Remove the lease only if it is the one we saw (never someone else's fresh lease)."""
    aside = path.with_name(f"{path.name}.{uuid.uuid4().hex}.released")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    loaded = _load(aside)
    if loaded is None or loaded[1] == token:
        _remove(aside)
        return
    try:
        os.link(aside, path)  # it was someone else's: put it back unless a newer one appeared
    except (FileExistsError, IsADirectoryError, PermissionError):  # a directory cannot be linked: it was damage anyway
        pass
    _remove(aside)


def _remove(path: Path) -> None:
    """Remove a lease put aside: a file, or whatever took a lease's name (a directory is removed with what it holds)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
