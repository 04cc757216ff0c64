"""Processes racing on one store, on disk and on a real S3 server: conditional writes decide, nothing is lost."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RACER = Path(__file__).with_name("racer.py")
PROCESS_TIMEOUT_S = 120


def race(store, mode: str, names: list[str], count: int, tmp_path: Path) -> dict[str, object]:
    """Start a racer per name, let them go at once, and return what each printed."""
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    processes = {name: subprocess.Popen([sys.executable, str(RACER), mode, store.uri, name, str(count), str(go)], env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name in names}
    try:
        while not all(Path(f"{go}.{name}").exists() for name in names):
            for name, process in processes.items():
                assert process.poll() is None, f"racer {name} exited early:\n{process.stderr.read()}"
            time.sleep(0.01)
        go.touch()
        outputs = {name: process.communicate(timeout=PROCESS_TIMEOUT_S) for name, process in processes.items()}
    finally:
        for process in processes.values():
            process.kill()
    for name, (out, err) in outputs.items():
        assert processes[name].returncode == 0, f"racer {name}:\n{err}"
    return {name: json.loads(out) for name, (out, _) in outputs.items()}


def test_two_processes_creating_the_same_keys_at_once_exactly_one_wins_each_and_both_read_the_winner(store, tmp_path):
    count = 20
    seen = race(store, "create", ["a", "b"], count, tmp_path)
    for i in range(count):
        a, b = seen["a"][i], seen["b"][i]
        assert a["won"] != b["won"], f"race/{i}: {a} and {b}"
        winner = "a" if a["won"] else "b"
        assert a["holds"] == b["holds"] == f"{winner}-{i}"
        assert store.get(f"race/{i}", limit=100).data == f"{winner}-{i}".encode()


def test_increments_by_replace_if_match_from_two_processes_lose_no_update(store, tmp_path):
    store.put("counter", b"0")
    count = 25
    seen = race(store, "increment", ["a", "b"], count, tmp_path)
    assert store.get("counter", limit=100).data == str(2 * count).encode(), seen
