"""The SQL box's worker: each query runs in a process of its own, under an address-space limit, killed past its time.

DuckDB's `memory_limit` covers its buffer manager only: `SELECT length(repeat('x', 2200000000))`
allocates outside it, and its interrupt is not checked inside one long function call. So the
server never runs a query itself. It writes the snapshot as Arrow IPC files, starts
`python -m factory.podium.worker` and sends it the request; the worker maps the files, opens its
DuckDB, caps its own address space (`RLIMIT_AS`) at what it holds plus `MEMORY_BYTES`, runs the
query and writes at most `row_limit` rows and `RESULT_BYTES` bytes as a JSON reply file, which the
server reads only when it is no bigger than that. The server kills it when it outlives its time. At most `WORKERS` queries run at once; another waits up to
`BUSY_WAIT_S` for a slot, then is told the box is busy.
"""

from __future__ import annotations

import decimal
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from factory.podium.cells import Preview
from factory.podium.errors import Busy, PodiumError
from factory.podium.sql import ROW_LIMIT, SECONDS, SqlResult, connection, execute, single_select

WORKERS = 2
"""Queries that may run at once."""
BUSY_WAIT_S = 5.0
"""How long a query waits for a free worker before it is refused as busy."""
MEMORY_BYTES = 2 << 30
"""Address space a query may use beyond the worker's start-up and the mapped snapshot."""
KILL_GRACE_S = 3.0
"""How long past its own time limit the worker is given to stop by itself before it is killed."""
RESULT_BYTES = 8 << 20
"""Bytes of rows a worker sends back at most; rows beyond are left out as past the limit."""
REPLY_OVERHEAD_BYTES = 64 << 10
"""Room in a reply for its fields and error message beyond the rows' and column names' bytes."""

_slots = threading.BoundedSemaphore(WORKERS)


def run_query(
    tables: Mapping[str, pa.Table], text: str, params: Sequence[Any] | Mapping[str, Any] = (),
    row_limit: int = ROW_LIMIT, seconds: float = SECONDS, memory_bytes: int = MEMORY_BYTES, result_bytes: int = RESULT_BYTES,
) -> SqlResult:
    """Run one SELECT over `tables` (registered under their names) in a worker process."""
    statement = single_select(text)
    if not _slots.acquire(timeout=BUSY_WAIT_S):
        raise Busy(f"the SQL box is busy: {WORKERS} queries are running; try again in a few seconds")
    try:
        with tempfile.TemporaryDirectory(prefix="podium-sql-") as folder:
            files: dict[int, str] = {}
            for table in tables.values():
                if id(table) not in files:
                    files[id(table)] = str(Path(folder) / f"{len(files)}.arrow")
                    _write_ipc(table, files[id(table)])
            request = {"tables": {name: files[id(table)] for name, table in tables.items()}, "query": statement,
                       "params": params, "row_limit": row_limit, "seconds": seconds, "memory_bytes": memory_bytes,
                       "result_bytes": result_bytes, "folder": folder}
            code = _spawn(request, seconds + KILL_GRACE_S, seconds)
            return _reply(Path(folder), code, memory_bytes, result_bytes)
    finally:
        _slots.release()


def _write_ipc(table: pa.Table, path: str) -> None:
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def _spawn(request: dict[str, Any], deadline_s: float, seconds: float) -> int:
    """The worker's exit status; killed (and reported as past its time) when it outlives `deadline_s`."""
    with open(Path(request["folder"]) / "stderr", "wb") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "factory.podium.worker"], stdin=subprocess.PIPE,
                                   stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        process.communicate(json.dumps(request).encode(), timeout=deadline_s)
    except subprocess.TimeoutExpired as e:
        raise PodiumError(f"the query ran past the {seconds:g} s limit and was stopped; add a WHERE or a LIMIT") from e
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode


def _reply(folder: Path, code: int, memory_bytes: int, result_bytes: int) -> SqlResult:
    """The worker's reply, read only when its size is within the bound the worker was given."""
    path = folder / "reply.json"
    if not path.exists():
        with open(folder / "stderr", "rb") as stderr:
            stderr.seek(max(0, stderr.seek(0, os.SEEK_END) - 4096))
            why = stderr.read().decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {code}"]
        raise PodiumError(f"the query stopped its worker ({why[0][:300]}); most often it needed more than the "
                          f"{memory_bytes / 2**30:g} GiB a query may use: add a WHERE or a LIMIT, or build smaller values")
    if path.stat().st_size > result_bytes + REPLY_OVERHEAD_BYTES:
        raise PodiumError(f"the query's reply is {path.stat().st_size} bytes, past the {result_bytes} the SQL box shows; select fewer columns")
    reply = json.loads(path.read_bytes())
    if "error" in reply:
        raise PodiumError(reply["error"])
    rows = [tuple(_cell(value) for value in row) for row in reply["rows"]]
    return SqlResult(columns=tuple(reply["columns"]), rows=rows, truncated=reply["truncated"], seconds=reply["seconds"])


def _cell(value: Any) -> Any:
    if isinstance(value, dict):
        return decimal.Decimal(value["decimal"]) if "decimal" in value else Preview(value["text"], value["length"])
    return value


def _encoded(value: Any) -> Any:
    if isinstance(value, Preview):
        return {"text": value.text, "length": value.length}
    if isinstance(value, decimal.Decimal):
        return {"decimal": str(value)}
    return value


# --- the worker process ---------------------------------------------------------------------


def answer(request: Mapping[str, Any]) -> dict[str, Any]:
    """Run the request's query; the reply as JSON-ready data, rows cut to the request's `result_bytes`."""
    memory_bytes = int(request["memory_bytes"])
    with connection(memory_limit=f"{memory_bytes // 2 // 2**20}MB", spill_to=str(Path(request["folder"]) / "spill")) as con:
        for name, path in request["tables"].items():
            con.register(name, pa.ipc.open_file(pa.memory_map(path)).read_all())
        con.execute("SET lock_configuration = true")
        con.execute("SELECT 1").fetchall()  # start DuckDB's threads before the address space is capped
        _cap_address_space(memory_bytes)
        result = execute(con, single_select(request["query"]), request["params"], request["row_limit"], request["seconds"])
    rows, size, truncated = [], len(json.dumps(result.columns)), result.truncated
    if size > request["result_bytes"]:
        raise PodiumError(f"the query's {len(result.columns)} column names alone take {size} bytes, past the "
                          f"{request['result_bytes']} the SQL box shows; select fewer columns")
    for row in result.rows:
        encoded = [_encoded(value) for value in row]
        size += len(json.dumps(encoded))
        if size > request["result_bytes"]:
            truncated = True
            break
        rows.append(encoded)
    return {"columns": list(result.columns), "rows": rows, "truncated": truncated, "seconds": result.seconds}


def _cap_address_space(extra_bytes: int) -> None:
    """Limit this process's address space to what it maps now plus `extra_bytes`: past it, allocations fail."""
    try:
        with open("/proc/self/statm") as statm:
            mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except FileNotFoundError:  # not Linux: macOS does not enforce RLIMIT_AS, so only DuckDB's memory_limit applies
        return
    limit = mapped + extra_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main() -> None:
    """Read one request on stdin, write its reply to `reply.json` in the request's folder."""
    request = json.loads(sys.stdin.buffer.read())
    try:
        reply = answer(request)
    except PodiumError as e:
        reply = {"error": str(e)}
    except MemoryError as e:
        reply = {"error": f"the query needed more memory than the SQL box allows ({e or 'out of memory'}); add a WHERE or a LIMIT"}
    partial = Path(request["folder"]) / "reply.json.partial"
    partial.write_text(json.dumps(reply))
    partial.rename(partial.with_suffix(""))


if __name__ == "__main__":
    main()
