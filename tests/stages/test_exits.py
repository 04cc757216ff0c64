"""A stage process stops on SIGTERM or Ctrl-C even when the signal lands in a finalizer, where Python drops exceptions."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STAGE = """
import os, signal, sys, time, weakref
from factory.runtime.exits import stop_on_signals

stop_on_signals()

class Buffer:
    pass

def finalizer(_):  # as the garbage collector runs it, anywhere in a stage's work
    os.kill(os.getpid(), signal.SIG{name})
    for _ in range(100_000):
        pass  # the handler runs here, inside the finalizer

buffer = Buffer()
watched = weakref.ref(buffer, finalizer)
try:
    del buffer
    time.sleep(10)
    print("went on")
except KeyboardInterrupt:
    print("stopped")
"""


def test_a_stop_signal_that_lands_in_a_finalizer_still_stops_the_stage():
    for name in ("TERM", "INT"):
        done = subprocess.run([sys.executable, "-c", STAGE.format(name=name)], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert (done.stdout, done.returncode) == ("stopped\n", 0), (name, done.stdout, done.stderr)
        assert "Exception ignored" not in done.stderr, done.stderr
