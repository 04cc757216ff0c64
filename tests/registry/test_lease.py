"""Leases across real processes: one holder at a time, waiters wait, stale leases are taken over."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from factory.atomic import synced_temp
from factory.registry import lease
from factory.registry.lease import LeaseBusy, hold, read_holder, record

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from factory.registry.lease import hold
    lease, log, name = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    others = [Path(f"{log}.waits-{other}") for other in sys.argv[4:]]  # holders started beside this one

    def waiting(holder):
        print("waiting for", holder.owner, flush=True)
        Path(f"{log}.waits-{name}").touch()
        others.clear()  # the other held it first: nobody is left to wait for this one

    with hold(lease, name, poll_s=0.05, on_wait=waiting):
        with open(log, "a") as f:
            f.write(f"start {name}\\n"); f.flush(); time.sleep(0.5)
            deadline = time.monotonic() + 30  # the first holder holds it until the other waits (it would not, holding it too)
            while others and not any(path.exists() for path in others) and time.monotonic() < deadline:
                time.sleep(0.01)
            f.write(f"end {name}\\n")
    """
)


def test_two_processes_never_hold_the_lease_at_once(tmp_path):
    lease, log = tmp_path / "x.lease", tmp_path / "log"
    procs = [subprocess.Popen([sys.executable, "-c", HOLDER, str(lease), str(log), n, *set("ab") - {n}], stdout=subprocess.PIPE, text=True)
             for n in "ab"]  # whichever holds it first keeps it until the other waits: on a loaded machine, too
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
    lease.write_text(json.dumps({"owner": "dead", "token": "t", "host": "h", "pid": 1, "beat": time.time() - 1000}))
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


TAKER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from factory.registry.lease import hold, read_holder
    lease, stale_after_s = Path(sys.argv[1]), float(sys.argv[2])
    taken = []
    cpu_s = time.process_time()
    with hold(lease, "next", stale_after_s=stale_after_s, poll_s=0.05, on_takeover=taken.append):
        cpu_s = time.process_time() - cpu_s
        owner = read_holder(lease).owner
    print(json.dumps({"cpu_s": cpu_s, "taken": [h.owner for h in taken], "owner": owner}))
    """
)


def take_over(lease, stale_after_s: float) -> tuple[dict, str]:
    """Wait for the lease in a fresh process (a spinning or endless wait fails by the timeout, not by hanging the tests)."""
    done = subprocess.run([sys.executable, "-c", TAKER, str(lease), str(stale_after_s)], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def record(owner: str, beat: float) -> str:
    return json.dumps({"owner": owner, "token": "t", "host": "elsewhere", "pid": 1, "beat": beat})


def test_an_empty_lease_is_taken_over_after_the_timeout_without_spinning(tmp_path):
    lease = tmp_path / "x.lease"
    lease.write_bytes(b"")  # a crash or a full disk between create and write
    result, stderr = take_over(lease, stale_after_s=1.0)
    assert result["owner"] == "next"
    assert len(result["taken"]) == 1 and "unreadable" in result["taken"][0]
    assert result["cpu_s"] < 0.5  # a second of waiting, asleep: a spinning loop would burn all of it
    assert "cannot be read" in stderr and "x.lease" in stderr
    assert not lease.exists()


def test_a_lease_with_missing_keys_is_read_as_unreadable_with_a_warning(tmp_path, caplog):
    lease = tmp_path / "x.lease"
    lease.write_text('{"owner": "old"}')
    holder = read_holder(lease)
    assert holder.damage and "token" in holder.damage and holder.age_s < 60
    assert "cannot be read" in caplog.text


def test_the_heartbeat_is_judged_by_the_beat_written_in_the_lease_not_its_mtime(tmp_path):
    lease = tmp_path / "x.lease"
    lease.write_text(record("silent", time.time() - 1000))  # touched just now, beat long ago
    assert read_holder(lease).age_s > 900
    result, _ = take_over(lease, stale_after_s=60)
    assert result["taken"] == ["silent"]


@pytest.mark.parametrize("content", ["beat", "empty"])
def test_a_lease_from_the_future_is_taken_over_after_the_timeout_of_the_readers_clock(tmp_path, content):
    lease = tmp_path / "x.lease"
    future = time.time() + 3600  # the holder's clock (and the file server's) run an hour ahead
    lease.write_text(record("skewed", future) if content == "beat" else "")
    os.utime(lease, (future, future))
    assert read_holder(lease).age_s == 0  # a beat from the future counts as now
    result, _ = take_over(lease, stale_after_s=1.0)
    assert result["owner"] == "next" and len(result["taken"]) == 1


def test_the_holder_writes_a_fresh_beat_into_its_lease(tmp_path):
    lease = tmp_path / "x.lease"
    with hold(lease, "me", heartbeat_s=0.05):
        first = json.loads(lease.read_text())["beat"]
        deadline = time.monotonic() + 30
        while json.loads(lease.read_text())["beat"] == first:
            assert time.monotonic() < deadline, "no heartbeat"
            time.sleep(0.02)
        assert read_holder(lease).owner == "me"
    assert not lease.exists()


def test_a_ctrl_c_while_the_last_beat_is_written_still_releases_the_lease(tmp_path, monkeypatch):
    """The interrupt lands while the block's end waits for a beat being written: it is raised once the beat is done, and
    the lease goes (released before the beat, the beat would put it back; not released at all, it would stay)."""
    path = tmp_path / "x.lease"

    def slow_beat(path, owner, token, stop, interval_s, needs=()):
        stop.wait()
        time.sleep(0.5)  # a beat's write that the block's end must wait for
        with synced_temp(path, record(owner, token)) as tmp:
            os.replace(tmp, path)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    monkeypatch.setattr(lease, "_heartbeat", slow_beat)
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        with pytest.raises(KeyboardInterrupt), hold(path, "me"):
            signal.setitimer(signal.ITIMER_REAL, 0.2)  # fires while the end of the block waits for the beat
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert not path.exists()


def test_a_lease_asked_for_without_waiting_says_who_holds_it_and_leaves_their_lease_alone(tmp_path):
    path = tmp_path / "x.lease"
    with hold(path, "the holder"):
        before = (os.stat(path).st_ctime_ns, path.read_bytes())
        with pytest.raises(LeaseBusy, match="the holder holds it") as busy, hold(path, "gc", wait=False):
            pass
        assert busy.value.holder.owner == "the holder"
        assert (os.stat(path).st_ctime_ns, path.read_bytes()) == before  # never moved aside, never written
    with hold(path, "gc", wait=False, needs=["a" * 64]):  # free: taken at once, and it says what it reads
        assert read_holder(path).needs == ("a" * 64,)
    assert not path.exists()
