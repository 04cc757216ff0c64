"""Leases across real processes: one holder at a time, waiters wait, stale leases are taken over."""

import os
import subprocess
import sys
import textwrap
import time

from factory.registry.lease import hold, read_holder

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from factory.registry.lease import hold
    lease, log, name = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    with hold(lease, name, poll_s=0.05, on_wait=lambda h: print("waiting for", h.owner, flush=True)):
        with open(log, "a") as f:
            f.write(f"start {name}\\n"); f.flush(); time.sleep(0.5); f.write(f"end {name}\\n")
    """
)


def test_two_processes_never_hold_the_lease_at_once(tmp_path):
    lease, log = tmp_path / "x.lease", tmp_path / "log"
    procs = [subprocess.Popen([sys.executable, "-c", HOLDER, str(lease), str(log), n], stdout=subprocess.PIPE, text=True) for n in "ab"]
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    lines = log.read_text().split()
    events = list(zip(lines[::2], lines[1::2], strict=True))
    assert [e[0] for e in events] == ["start", "end", "start", "end"]
    assert events[0][1] == events[1][1] and events[2][1] == events[3][1]
    assert sum("waiting for" in out for out in outputs) == 1
    assert not lease.exists()


def test_a_waiter_sees_the_holder_and_gets_the_lease_after_release(tmp_path):
    lease, log = tmp_path / "x.lease", tmp_path / "log"
    with hold(lease, "the test"):
        assert read_holder(lease).owner == "the test"
        waiter = subprocess.Popen([sys.executable, "-c", HOLDER, str(lease), str(log), "w"], stdout=subprocess.PIPE, text=True)
        first_line = waiter.stdout.readline()
        assert "waiting for the test" in first_line
        assert not log.exists()
    waiter.communicate(timeout=60)
    assert waiter.returncode == 0 and log.read_text().split() == ["start", "w", "end", "w"]


def test_a_stale_lease_is_taken_over(tmp_path):
    lease = tmp_path / "x.lease"
    lease.write_text('{"owner": "dead", "token": "t", "host": "h", "pid": 1}')
    old = time.time() - 1000
    os.utime(lease, (old, old))
    taken = []
    with hold(lease, "alive", stale_after_s=60, on_takeover=taken.append):
        assert read_holder(lease).owner == "alive"
    assert [h.owner for h in taken] == ["dead"]
    assert not lease.exists()


def test_a_lease_whose_holder_was_killed_on_this_machine_is_taken_over_at_once(tmp_path):
    lease, log = tmp_path / "x.lease", tmp_path / "log"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER.replace("time.sleep(0.5)", "time.sleep(600)"), str(lease), str(log), "k"])
    deadline = time.monotonic() + 60
    while not (log.exists() and log.read_text()):
        assert time.monotonic() < deadline, "the holder never started"
        time.sleep(0.05)
    holder.kill()
    holder.wait()
    assert read_holder(lease).owner == "k"  # the fresh heartbeat says alive; the dead pid says otherwise
    taken = []
    with hold(lease, "next", stale_after_s=600, on_takeover=taken.append):
        assert read_holder(lease).owner == "next"
    assert [h.owner for h in taken] == ["k"]
