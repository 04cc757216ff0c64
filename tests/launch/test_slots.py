"""Pool slots on this machine: at most `slots` holders at once, the others wait and say so once; a killed holder's slot
is free again."""

import subprocess
import sys
import threading

from factory.launch.slots import pool_slot


def test_a_second_holder_waits_for_the_only_slot_and_says_so_once(tmp_path):
    held, release, events = threading.Event(), threading.Event(), []

    def first() -> None:
        with pool_slot(tmp_path, "training", 1, lambda _: events.append("first waited"), holder="run one"):
            events.append("first in")
            held.set()
            release.wait(10)
            events.append("first leaves")  # inside the slot: after the slot is free, the second may run first

    thread = threading.Thread(target=first)
    thread.start()
    held.wait(10)
    threading.Timer(1.0, release.set).start()
    with pool_slot(tmp_path, "training", 1, lambda held_by: events.append(f"second waited for {held_by}")):
        events.append("second in")
    thread.join(10)
    assert events == ["first in", "second waited for ['run one']", "first leaves", "second in"]


def test_as_many_holders_as_slots_go_at_once(tmp_path):
    with pool_slot(tmp_path, "training", 2, lambda _: None) as one, pool_slot(tmp_path, "training", 2, lambda _: None) as two:
        assert {one, two} == {0, 1}
    with pool_slot(tmp_path, "evaluation", 1, lambda _: None) as other:  # pools do not share slots
        assert other == 0


def test_a_killed_holder_gives_its_slot_back(tmp_path):
    code = (f"import sys, time; from pathlib import Path; from factory.launch.slots import pool_slot\n"
            f"with pool_slot(Path({str(tmp_path)!r}), 'training', 1, lambda _: None):\n"
            f"    print('in', flush=True); time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "in"
        waited = []
        threading.Timer(0.5, holder.kill).start()
        with pool_slot(tmp_path, "training", 1, lambda _: waited.append(True)):
            pass
        assert len(waited) == 1  # it was taken when asked, and given back when its holder died
    finally:
        holder.kill()
        holder.wait(10)
