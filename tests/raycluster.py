"""A real Ray cluster for the tests: `ray start --head` on 127.0.0.1 (one node, the dashboard off), in a process group
of its own that is killed whole when the test is done."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

from tests.ports import free_port, serving

START_TIMEOUT_S = 180
RAY = Path(sys.executable).parent / "ray"


def auth(token: str) -> dict[str, str]:
    """The environment of a Ray cluster that takes only `token`, and of a driver that connects to it with it: set
    explicitly, so that neither reads the token Ray keeps in ~/.ray (a local `ray.init()` writes one there)."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}


@contextlib.contextmanager
def running_ray(env: Mapping[str, str], cpus: int = 2) -> Iterator[tuple[str, str, dict[str, str]]]:
    """A Ray head started with `env` added to ours (its workers inherit it: a plugin's PYTHONPATH, say), taking one token;
    its GCS address (a driver on a node of the cluster), its Ray Client address (`ray://`: a driver anywhere, as a stage's
    pod on Kubernetes), and the environment a driver connects with."""
    port, client_port = free_port(), free_port()  # ephemeral ports: outside the range Ray's workers take theirs from
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    argv = [str(RAY), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}", f"--ray-client-server-port={client_port}",
            f"--num-cpus={cpus}", "--include-dashboard=false",
            "--disable-usage-stats", f"--temp-dir={temp}"]
    driver = auth(secrets.token_hex(32))
    process = subprocess.Popen(argv, env={**os.environ, **env, **driver}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    said: list[str] = []
    started = threading.Event()

    def follow() -> None:
        for line in process.stdout:
            said.append(line)
            if "Ray runtime started" in line:
                started.set()

    threading.Thread(target=follow, daemon=True).start()
    try:
        if not started.wait(START_TIMEOUT_S) or not serving(lambda: _accepts(client_port), process, START_TIMEOUT_S, 0.2, (OSError,)):
            raise RuntimeError("ray start did not start a head and its client server in time:\n" + "".join(said[-30:]))
        yield f"127.0.0.1:{port}", f"ray://127.0.0.1:{client_port}", driver
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the head, its raylet and every worker: one group
        process.wait(30)
        shutil.rmtree(temp, ignore_errors=True)


def _accepts(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:`port` (Ray's client server starts after the head says so)."""
    with socket.create_connection(("127.0.0.1", port), 1):
        return True
