"""Leases in an object store, where there is no rename and no hard link: conditional writes instead.

A lease is an object created only if absent (`If-None-Match: *`). Its holder renews it, and a waiter takes over an
abandoned one, only by replacing the exact version it read (`If-Match: <etag>`): of two processes that see the same
stale lease, one write wins and the other reads the winner and waits. Releasing replaces the holder's own version with
a record that names no holder, so a release never removes a lease someone else took over in the meantime.

A conditional write can be carried out and its answer lost (a cut connection, a 500): the client sends it again, and
the second try is refused, since the first one changed the object. So a refused write is checked against what the
lease holds: when that is this holder's own token, the write was its own, and it holds the lease (at that version).

Who holds it, how old it is and when it counts as abandoned are judged as for a lease on disk (`factory.registry.lease`).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from factory.registry.lease import (
    LEASE_BYTES,
    LEASE_HEARTBEAT_S,
    LEASE_POLL_S,
    LEASE_STALE_S,
    Holder,
    LeaseBusy,
    abandoned,
    holder_of,
    parse_lease,
    record,
)
from factory.storage import Blob, ObjectStore

RELEASED = b'{"released": true}'
"""What a released lease holds: no holder (the object stays, and the next holder replaces it)."""


def read_holder(store: ObjectStore, key: str) -> Holder | None:
    """Who holds the lease at `key`, or None when nobody does."""
    blob = store.get(key, limit=LEASE_BYTES)
    return None if blob is None else _holder(store, key, blob)


@contextlib.contextmanager
def hold(
    store: ObjectStore,
    key: str,
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
    """Block until this process holds the lease at `key`; keep it alive until the block ends (`needs`, `wait`: as
    `factory.registry.lease.hold`'s)."""
    token = uuid.uuid4().hex
    held = _Held(store, key, owner, token, tuple(needs))
    announced = False
    try:
        while not held.etag:
            if (etag := store.create(key, held.record())) is not None:
                held.etag = etag
                break
            blob = store.get(key, limit=LEASE_BYTES)
            if blob is None:
                continue  # removed a moment ago: create it
            holder = _holder(store, key, blob)
            if holder is not None and holder.token == token:  # this process's own write, whose answer was lost
                held.etag = blob.etag
                break
            why = "released" if holder is None else abandoned(holder, stale_after_s)
            if why is not None:
                if holder is not None and on_takeover:
                    on_takeover(holder)
                held.etag = store.replace(key, held.record(), blob.etag)  # None: another waiter won
                continue
            if not wait:
                raise LeaseBusy(holder)
            if on_wait and not announced:
                on_wait(holder)
                announced = True
            time.sleep(poll_s)
        beat = threading.Thread(target=held.renew_every, args=(heartbeat_s,), daemon=True)
        beat.start()
        try:
            yield
        finally:
            held.stop.set()
            beat.join()
    finally:
        held.release()


class _Held:
    """This process's version of a lease (its ETag), renewed by the heartbeat and released at the end."""

    def __init__(self, store: ObjectStore, key: str, owner: str, token: str, needs: tuple[str, ...]) -> None:
        self.store, self.key, self.owner, self.token, self.needs = store, key, owner, token, needs
        self.etag: str | None = None
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def renew_every(self, interval_s: float) -> None:
        while not self.stop.wait(interval_s):
            with self.lock:
                if self.etag is None:
                    return
                self.etag = self.store.replace(self.key, self.record(), self.etag) or self._own_version()
                if self.etag is None:
                    return  # taken over: no longer ours to keep alive

    def record(self) -> bytes:
        """The lease's content, with a fresh beat."""
        return record(self.owner, self.token, self.needs)

    def _own_version(self) -> str | None:
        """The ETag of the lease when it holds this holder's token (a refused write that was this holder's own, its
        answer lost), else None."""
        blob = self.store.get(self.key, limit=LEASE_BYTES)
        holder = None if blob is None else _holder(self.store, self.key, blob)
        return blob.etag if holder is not None and holder.token == self.token else None

    def release(self) -> None:
        with self.lock:
            if self.etag is not None:
                self.store.replace(self.key, RELEASED, self.etag)  # loses (and leaves it) if it was taken over
                self.etag = None


def _holder(store: ObjectStore, key: str, blob: Blob) -> Holder | None:
    where = f"{store.uri}/{key}"
    try:
        data: Any = json.loads(blob.data)
        if data == {"released": True}:
            return None
        beat = parse_lease(data)
    except (ValueError, OverflowError, RecursionError) as e:
        damage = "empty" if not blob.data.strip() else str(e)[:200]
        return holder_of(where, {}, f"unreadable:{blob.etag}", damage, 0.0)
    return holder_of(where, data, data["token"], "", time.time() - beat)
