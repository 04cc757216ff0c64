"""The embedded instance's compute logs (`assets/compute_logs.py`): what a run prints reaches the terminal and the run's
log files, the last lines too, and no process is started to copy it."""

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
from dagster import DagsterEventType, DagsterInstance, asset

from assets.compute_logs import end_mirrors, mirrored
from factory.cli.common import dagster_home

REPO = Path(__file__).resolve().parents[2]
CHILD = "said by a child process, as a stage is"


@asset
def spoken() -> int:
    print("said on stdout by the step", flush=True)
    print("said on stderr by the step", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-c", f"import time; print({CHILD!r}, flush=True); time.sleep(0.5)"], check=True)
    print("the step's last words", flush=True)  # printed as the run ends: they must still reach the terminal
    return 1


RUN = """
import json, sys
from pathlib import Path
from dagster import DagsterInstance, materialize
from tests.assets.test_compute_logs import log_key, spoken
with DagsterInstance.from_config(sys.argv[1]) as instance:
    result = materialize([spoken], instance=instance)
    logs = instance.compute_log_manager.get_log_data(log_key(instance, result.run_id))
Path(sys.argv[2]).write_text(json.dumps({"success": result.success, "out": logs.stdout.decode(), "err": logs.stderr.decode()}))
"""
"""A run in a process of its own, as `factory run`'s: its stdout and stderr are the process's descriptors 1 and 2."""


def test_what_a_run_prints_reaches_the_terminal_and_its_logs_and_no_process_is_started_to_copy_it(tmp_path, monkeypatch):
    monkeypatch.delenv("FACTORY_DATABASE_URL", raising=False)
    seen: set[str] = set()
    process = subprocess.Popen([sys.executable, "-c", RUN, str(dagster_home(tmp_path / "root")), str(tmp_path / "logs.json")], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watcher = threading.Thread(target=watch, args=(process, seen), daemon=True)
    watcher.start()
    out, err = process.communicate(timeout=300)
    watcher.join()
    assert process.returncode == 0, err[-3000:]
    logs = json.loads((tmp_path / "logs.json").read_text())
    assert logs["success"]
    assert any(CHILD in command for command in seen), "the watch saw the step's own child"
    assert not [command for command in seen if command.startswith("tail ") or "watch_orphans" in command]
    for said in ("said on stdout by the step", CHILD, "the step's last words"):
        assert said in out and said in logs["out"]
    assert "said on stderr by the step" in err and "said on stderr by the step" in logs["err"]


def test_everything_written_before_a_capture_ends_reaches_where_the_stream_led(tmp_path):
    lines = [f"line {number}" for number in range(2000)]
    said = through_pipe(lambda stream: capture(stream, tmp_path / "out.log", lines))
    assert said == [*lines, "after the capture"]
    assert (tmp_path / "out.log").read_text().splitlines() == lines


def test_a_process_leaving_in_the_middle_of_a_run_first_gives_back_its_streams_with_what_they_held(tmp_path):
    def run(stream) -> None:
        with mirrored(stream, str(tmp_path / "out.log")):
            print("said before the stop", file=stream, flush=True)
            stopping = threading.Thread(target=end_mirrors)  # as the watch of `factory run` does before it leaves
            stopping.start()
            stopping.join()
            print("said after it", file=stream, flush=True)

    assert through_pipe(run) == ["said before the stop", "said after it"]
    assert (tmp_path / "out.log").read_text().splitlines() == ["said before the stop"]


def capture(stream, path: Path, lines: list[str]) -> None:
    with mirrored(stream, str(path)):
        for line in lines:
            print(line, file=stream)  # buffered: the end of the capture flushes the last of them
    print("after the capture", file=stream, flush=True)


def through_pipe(write) -> list[str]:
    """The lines `write(stream)` sends through a stream on a pipe, read once it is done."""
    read, written = os.pipe()
    with os.fdopen(written, "w") as stream:
        write(stream)
    with os.fdopen(read) as pipe:
        return pipe.read().splitlines()


def watch(process: subprocess.Popen, seen: set[str]) -> None:
    """The command lines of every process under `process` while it runs, into `seen`."""
    with contextlib.suppress(psutil.Error):
        parent = psutil.Process(process.pid)
        while process.poll() is None:
            for child in parent.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    seen.add(" ".join(child.cmdline()))
            time.sleep(0.01)


def log_key(instance: DagsterInstance, run_id: str) -> list[str]:
    """The compute logs' key of a run's process (what the UI reads its stdout and stderr by)."""
    [captured] = [record.dagster_event.event_specific_data for record in instance.all_logs(run_id, of_type=DagsterEventType.LOGS_CAPTURED)]
    return instance.compute_log_manager.build_log_key_for_run(run_id, captured.file_key)
