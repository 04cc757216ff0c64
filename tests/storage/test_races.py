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


def test_a_conditional_write_s3_answers_409_is_sent_again_until_the_server_decides_it(s3_server, monkeypatch):
    """Real S3 answers a conditional write racing another of the same key with 409 ConditionalRequestConflict, which
    writes nothing and decides nothing (moto never does: the test server answers so on demand, `S3Server.conflict`)."""
    import uuid

    import pytest

    from factory.errors import StorageError
    from factory.storage import Blob, open_store
    from factory.storage.s3 import S3Settings, S3Store

    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    prefix = uuid.uuid4().hex
    store = open_store(f"s3://{s3_server.bucket}/{prefix}")
    try:
        s3_server.conflict(2)
        first = store.create("manifests/a.json", b"first")
        assert first is not None and store.get("manifests/a.json", limit=100) == Blob(b"first", first)
        s3_server.conflict(2)
        assert store.create("manifests/a.json", b"second") is None  # the key exists: the answer once the 409s end
        s3_server.conflict(2)
        second = store.replace("manifests/a.json", b"v2", first)
        assert second is not None and store.get("manifests/a.json", limit=100) == Blob(b"v2", second)
        s3_server.conflict(2)
        assert store.replace("manifests/a.json", b"v3 from a writer that read v1", first) is None

        # a server that answers 409 every time: the write fails saying so (obstore's own retries off, to be quick)
        unretried = S3Store(s3_server.bucket, prefix, S3Settings.from_environment(os.environ), retries=0)
        s3_server.conflict(1000)
        for write in (lambda: unretried.create("manifests/b.json", b"x"), lambda: unretried.replace("manifests/a.json", b"v3", second)):
            with pytest.raises(StorageError, match=r"manifests/\w\.json: \w+ failed: the server answered 409 ConditionalRequestConflict 6 times"):
                write()
        s3_server.conflict(0)
        assert store.stat("manifests/b.json") is None and store.get("manifests/a.json", limit=100) == Blob(b"v2", second)
    finally:
        s3_server.conflict(0)
