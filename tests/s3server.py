"""A real S3 server for the tests and benches: moto's standalone server, a process on 127.0.0.1 with its objects in memory.

Moto's handler checks `If-None-Match`/`If-Match` and then writes, under no lock (moto/s3/responses.py, put_object),
and `python -m moto.server` serves each request on a thread of its own: racing creates of one key both won once in
400 races here. Real S3 decides a conditional write atomically, so the server here is moto's own application with
one request handled at a time (a lock around it). `running_s3(parallel=True)` serves requests in parallel, as
`python -m moto.server` does: for measuring throughput, where conditional writes do not race.

Real S3 answers a conditional write that races another of the same key with 409 ConditionalRequestConflict, which moto
never does: `S3Server.conflict(n)` makes the server answer the next `n` conditional PUTs so, writing nothing, as S3
does for the write that lost the race. `S3Server.lose_replies(n)` makes it write the next `n` conditional PUTs and
answer each 500 InternalError: a write whose answer never reached its client (S3 documents that a request it answered
500 may have been carried out), which the client sends again.

With `relay=True` the endpoint is a second process that relays connections to moto: `kill` SIGKILLs it (requests in
flight are cut, new ones refused) and `restart` starts it again, and the objects written before are still there, as
with a real store after an outage. `python tests/s3server.py` serves one until Ctrl-C and prints its endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script (its servers are), as the benches are
from tests.ports import free_port, stopped  # noqa: E402

START_TIMEOUT_S = 30
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "factory-test", "AWS_SECRET_ACCESS_KEY": "factory-test-secret", "AWS_REGION": "us-east-1"}
"""Moto accepts any credentials; these are the ones the tests' clients send."""
READS_PATH = "/_factory/reads"
"""GET here: how many times each object was read (GET) since the server started, as JSON {path: count} (`S3Server.reads`)."""
CONFLICTS_PATH = "/_factory/conflicts"
"""POST a count here: the next that many conditional writes are answered 409 (`S3Server.conflict`)."""
LOST_PATH = "/_factory/lost"
"""POST a count here: the next that many conditional writes are carried out and answered 500 (`S3Server.lose_replies`)."""
LOST_BODY = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code><Message>We encountered an internal '
             b'error. Please try again.</Message></Error>')
CONFLICT_BODY = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ConditionalRequestConflict</Code><Message>A conflicting '
                 b'conditional operation is currently in progress against this resource.</Message></Error>')


class S3Server:
    """A started server (`running_s3`): its endpoint, its bucket, the AWS variables that reach it; `kill` and `restart`."""

    def __init__(self, bucket: str, relay: bool, parallel: bool, checks_credentials: bool) -> None:
        self.bucket = bucket
        self._moto_port = free_port()
        argv = [sys.executable, __file__, "serve", str(self._moto_port), *(["--parallel"] if parallel else [])]
        # moto checks credentials against its IAM users after this many requests: the one creating the bucket passes,
        # and no later one does (it knows no user)
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "1"} if checks_credentials else None
        self._moto = _start(argv, self._moto_port, env)
        self._relay_port = free_port() if relay else None
        self._relay: subprocess.Popen | None = None
        # held while the relay is being replaced: a client may reach a restarting relay before `restart` has recorded
        # it, and a `kill` in between must kill that one, not the one already dead
        self._switching = threading.Lock()
        if relay:
            self.restart()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._relay_port or self._moto_port}"

    @property
    def url(self) -> str:
        """The store's URI for `open_store`: the bucket and a prefix of its own."""
        return f"s3://{self.bucket}/factory"

    def env(self) -> dict[str, str]:
        """The variables a client (or a process a test starts) needs to reach this server."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}

    def conflict(self, count: int) -> None:
        """The next `count` conditional writes (`If-None-Match`/`If-Match`) are answered 409 ConditionalRequestConflict
        and write nothing (module docstring)."""
        request = urllib.request.Request(f"http://127.0.0.1:{self._moto_port}{CONFLICTS_PATH}", data=str(count).encode(), method="POST")
        urllib.request.urlopen(request, timeout=10).close()

    def lose_replies(self, count: int) -> None:
        """The next `count` conditional writes are carried out and answered 500 InternalError (module docstring)."""
        request = urllib.request.Request(f"http://127.0.0.1:{self._moto_port}{LOST_PATH}", data=str(count).encode(), method="POST")
        urllib.request.urlopen(request, timeout=10).close()

    def reads(self) -> dict[str, int]:
        """How many times each object was read (GET of `/bucket/key`) since the server started."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self._moto_port}{READS_PATH}", timeout=10) as response:
            return json.loads(response.read())

    def kill(self) -> None:
        """The endpoint goes away at once (SIGKILL): requests in flight are cut, new ones refused. The objects stay."""
        with self._switching:
            assert self._relay is not None, "kill needs running_s3(relay=True)"
            self._relay.kill()
            self._relay.wait()

    def restart(self) -> None:
        """The endpoint answers again, with the objects written before `kill`."""
        assert self._relay_port is not None
        argv = [sys.executable, __file__, "relay", str(self._relay_port), str(self._moto_port)]
        with self._switching:
            self._relay = _start(argv, self._relay_port)

    def stop(self) -> None:
        with self._switching:  # a restart in flight has recorded its relay: this stops it too
            for process in (self._relay, self._moto):
                if process is not None and process.poll() is None:
                    stopped(process, 10)


@contextlib.contextmanager
def running_s3(bucket: str = "factory-test", *, relay: bool = True, parallel: bool = False,
               checks_credentials: bool = False) -> Iterator[S3Server]:
    """A started server holding one empty bucket; stopped when the block ends. `relay`: `kill` and `restart` work;
    `parallel`: requests are not handled one at a time (module docstring); `checks_credentials`: every request after
    the bucket's creation is refused as from an unknown access key."""
    import boto3

    server = S3Server(bucket, relay, parallel, checks_credentials)
    try:
        client = boto3.client("s3", endpoint_url=server.endpoint, region_name=CREDENTIALS["AWS_REGION"],
                              aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"], aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
        client.create_bucket(Bucket=bucket)
        yield server
    finally:
        server.stop()


def _start(argv: list[str], port: int, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start a server process and wait until its port answers HTTP (any status)."""
    log = tempfile.TemporaryFile()  # not a pipe: a pipe nobody reads fills up, and the server blocks on its next line
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"{' '.join(argv)} exited {process.returncode}:\n{log.read().decode()[-2000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=2).close()
            return process
        except urllib.error.HTTPError:
            return process
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{' '.join(argv)} did not answer on 127.0.0.1:{port} within {START_TIMEOUT_S} s")


def _serve(port: int, parallel: bool) -> None:
    """Moto's application on 127.0.0.1:`port`, one request at a time unless `parallel` (module docstring)."""
    os.environ["MOTO_PORT"] = str(port)  # moto reads it on import, for the URLs it writes into responses
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import run_simple

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request
    moto = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()
    conflicts, lost, counting = [0], [0], threading.Lock()  # conditional writes still to answer 409, and 500 once written
    reads: dict[str, int] = {}

    def with_conflicts(environ, start_response):
        if environ["PATH_INFO"] == READS_PATH:
            with counting:
                body = json.dumps(reads).encode()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        if environ["REQUEST_METHOD"] == "GET" and not environ.get("QUERY_STRING"):  # an object read, not a listing
            with counting:
                reads[environ["PATH_INFO"]] = reads.get(environ["PATH_INFO"], 0) + 1
        for path, count in ((CONFLICTS_PATH, conflicts), (LOST_PATH, lost)):
            if environ["PATH_INFO"] == path:
                with counting:
                    count[0] = int(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)))
                start_response("204 No Content", [])
                return []
        conditional = environ["REQUEST_METHOD"] == "PUT" and ("HTTP_IF_NONE_MATCH" in environ or "HTTP_IF_MATCH" in environ)
        with counting:
            if conditional and conflicts[0] > 0:
                conflicts[0] -= 1
                environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
                start_response("409 Conflict", [("Content-Type", "application/xml"), ("Content-Length", str(len(CONFLICT_BODY)))])
                return [CONFLICT_BODY]
            losing = conditional and lost[0] > 0
            lost[0] -= losing
        if losing:
            b"".join(moto(environ, lambda *_: None))  # carried out, its answer dropped
            start_response("500 Internal Server Error", [("Content-Type", "application/xml"), ("Content-Length", str(len(LOST_BODY)))])
            return [LOST_BODY]
        return moto(environ, start_response)

    def one_at_a_time(environ, start_response):
        with lock:
            return list(with_conflicts(environ, start_response))  # the whole response, before the next request starts

    run_simple("127.0.0.1", port, with_conflicts if parallel else one_at_a_time, threaded=True, request_handler=MotoRequestHandler)


async def _relay(port: int, target: int) -> None:
    """Relay every connection to 127.0.0.1:`port` to 127.0.0.1:`target`, byte for byte."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass  # the other side went away: so does this one
        finally:
            writer.close()

    async def connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", target)
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    server = await asyncio.start_server(connect, "127.0.0.1", port)
    await server.serve_forever()


def main() -> None:
    if sys.argv[1:2] == ["serve"]:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        _serve(int(sys.argv[2]), parallel="--parallel" in sys.argv[3:])
    elif sys.argv[1:2] == ["relay"]:
        asyncio.run(_relay(int(sys.argv[2]), int(sys.argv[3])))
    else:
        with running_s3() as server:
            print(" ".join(f"{name}={value}" for name, value in server.env().items()), f"FACTORY_STORE={server.url}", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()


if __name__ == "__main__":
    main()
