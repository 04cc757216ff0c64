"""The suite's wall time and slowest modules (tests/timing.py), as `make test` prints them under pytest-xdist."""

import re
import subprocess
import sys

from tests.conftest import REPO
from tests.room import problem
from tests.timing import summary


def test_the_summary_gives_the_wall_time_and_the_slowest_modules_first():
    seconds = {"tests/a.py": 1.0, "tests/b.py": 30.25, "tests/c.py": 5.0}
    assert summary(125.4, seconds, slowest=2) == ("suite wall time: 2:05\nslowest 2 modules (setup, call and teardown summed):\n"
                                                  "     30.2 s  tests/b.py\n      5.0 s  tests/c.py")
    assert summary(125.4, seconds, {"gw1": 125.0, "gw0": 61.2}, slowest=1).splitlines()[0] == "suite wall time: 2:05, gw0 done at 1:01, gw1 done at 2:05"


def test_the_controller_adds_up_every_worker_s_modules(tmp_path):
    (tmp_path / "test_slow.py").write_text("import time\n\ndef test_one():\n    time.sleep(0.6)\n\ndef test_two():\n    time.sleep(0.6)\n")
    (tmp_path / "test_quick.py").write_text("def test_quick():\n    pass\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.timing", "-p", "no:randomly", "-n", "2", "--dist", "loadscope",
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any(re.fullmatch(r"suite wall time: \d+:[0-5]\d, gw\d done at \d+:[0-5]\d, gw\d done at \d+:[0-5]\d", line) for line in lines), done.stdout[-3000:]
    modules = lines[lines.index("slowest 2 modules (setup, call and teardown summed):") + 1 :][:2]
    assert modules[0].endswith("test_slow.py") and modules[1].endswith("test_quick.py"), modules
    assert float(modules[0].split()[0]) >= 1.2  # both of its tests, whichever worker ran them


CRAMPED = """
import sys
import pytest
import tests.room
tests.room.NEEDED_BYTES = 1 << 60  # more than any disk has
sys.exit(pytest.main(["-p", "tests.room", "-p", "no:randomly", "-q", sys.argv[1]]))
"""


def test_a_suite_without_room_on_disk_stops_before_any_test_saying_so(tmp_path):
    (tmp_path / "test_writes.py").write_text(f"def test_writes():\n    open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    done = subprocess.run([sys.executable, "-c", CRAMPED, str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "GiB free in" in done.stdout + done.stderr and "point TMPDIR at a disk that has it" in done.stdout + done.stderr
    assert not (tmp_path / "ran").exists()
    assert problem(str(tmp_path), 1) is None
