"""The forkserver of a run's steps (assets/forkserver.py): it imports what a step needs to open the instance, and forks
with nothing open that a step would inherit."""

import json
import os
import subprocess
import sys

from factory.cli.common import dagster_home

STORAGE = ("alembic", "dagster._core.storage.event_log.sqlite.sqlite_event_log", "dagster._core.storage.runs.sqlite.sqlite_run_storage")
PRELOAD = f"""
import json, sys, threading
import psutil
import assets.forkserver
print(json.dumps({{
    "storage": [name for name in {STORAGE!r} if name in sys.modules],
    "threads": [thread.name for thread in threading.enumerate() if thread is not threading.main_thread()],
    "open": [f.path for f in psutil.Process().open_files()],
}}))
"""


def test_the_forkserver_imports_the_instances_storage_and_forks_holding_no_connection_or_thread(tmp_path, monkeypatch):
    monkeypatch.delenv("FACTORY_DATABASE_URL", raising=False)  # the embedded instance, on sqlite
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home(tmp_path / "root"))}
    done = subprocess.run([sys.executable, "-c", PRELOAD], env=env, capture_output=True, text=True, check=True)
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["storage"] == list(STORAGE), seen
    assert seen["threads"] == [] and seen["open"] == [], seen
