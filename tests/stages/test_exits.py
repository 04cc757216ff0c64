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


HELD_UP = """
import signal, time
from factory.runtime import exits

armed = signal.setitimer

def held_up(*timer):  # the hook that redelivers, held up just after it armed the alarm, as a loaded machine holds a process
    signal.setitimer = armed
    armed(*timer)
    began = time.monotonic()
    while time.monotonic() - began < 10 * exits.REDELIVER_AFTER_S:
        pass

signal.setitimer = held_up
"""


def test_a_stop_signal_redelivered_while_its_hook_is_held_up_still_stops_the_stage():
    """The alarm that raises a dropped interrupt again can come before the hook that armed it returns (a CI run on a
    loaded machine): raised there, it was dropped for good, and the stage went on."""
    stage = STAGE.format(name="TERM").replace("stop_on_signals()\n", "stop_on_signals()\n" + HELD_UP, 1)
    done = subprocess.run([sys.executable, "-c", stage], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (done.stdout, done.returncode) == ("stopped\n", 0), (done.stdout, done.stderr)
    assert "Exception ignored" not in done.stderr, done.stderr


def test_a_stop_signal_that_lands_in_a_finalizer_still_stops_the_stage():
    for name in ("TERM", "INT"):
        done = subprocess.run([sys.executable, "-c", STAGE.format(name=name)], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert (done.stdout, done.returncode) == ("stopped\n", 0), (name, done.stdout, done.stderr)
        assert "Exception ignored" not in done.stderr, done.stderr


SERIALIZING = """
import os, signal
import pydantic
from factory.runtime.exits import interrupted, stop_on_signals

stop_on_signals()

class Metadata(pydantic.BaseModel):  # as pyiceberg writes a table's metadata: pydantic's serializer calls back into Python
    value: int = 1

    @pydantic.field_serializer("value")
    def _value(self, value):
        if not {stop}:
            raise ValueError("an error, and no stop")
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100_000):
            pass  # the handler runs here, inside the serializer
        return value

try:
    Metadata().model_dump_json()
    print("went on")
except Exception as e:
    print(type(e).__name__, interrupted(e))
"""


def test_a_stop_that_a_library_turned_into_its_own_error_is_still_a_stop():
    """A Ctrl-C that lands in pydantic's serializer comes out as its PydanticSerializationError (CI saw it in pyiceberg's
    commit): the stage still reports an interruption, not a crash with a traceback; an error with no stop is an error."""
    said = {}
    for stop in (True, False):
        done = subprocess.run([sys.executable, "-c", SERIALIZING.format(stop=stop)], cwd=REPO, capture_output=True, text=True, timeout=60)
        said[stop] = done.stdout.strip()
    assert said == {True: "PydanticSerializationError True", False: "PydanticSerializationError False"}, said
