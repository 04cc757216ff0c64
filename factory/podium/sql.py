"""The SQL box: one SELECT over Arrow tables, on a DuckDB that cannot touch files, under row and time limits.

The statement is parsed first and refused unless it is exactly one SELECT. The connection has
external access (files, URLs, `ATTACH`, extensions) disabled and its configuration locked before
the query runs; a timer interrupts it past its time; at most `row_limit` rows come back, each
cell cut to `CELL_CHARS` characters.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from factory.podium.cells import preview
from factory.podium.errors import PodiumError

ROW_LIMIT = 500
SECONDS = 10.0
CELL_CHARS = 2000


@dataclass(frozen=True, kw_only=True, slots=True)
class SqlResult:
    """What a SELECT returned, up to the row limit; cells as `preview` gives them."""

    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    truncated: bool
    seconds: float


def connection() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB that cannot read or write files, load extensions or attach databases."""
    return duckdb.connect(config={"enable_external_access": False, "autoload_known_extensions": False,
                                  "autoinstall_known_extensions": False, "memory_limit": "2GB", "threads": 2})


def single_select(text: str) -> str:
    """The text's one statement, when it is a SELECT; anything else is refused with the reason."""
    try:
        statements = duckdb.extract_statements(text)
    except duckdb.Error as e:
        raise PodiumError(f"the query does not parse: {first_line(e)}") from e
    if len(statements) != 1:
        raise PodiumError(f"write exactly one statement; found {len(statements)}")
    if statements[0].type != duckdb.StatementType.SELECT:
        raise PodiumError(f"only SELECT queries run here; this is a {statements[0].type.name} statement")
    return statements[0].query


def run_select(
    tables: Mapping[str, pa.Table], text: str, params: Sequence[Any] | Mapping[str, Any] = (),
    row_limit: int = ROW_LIMIT, seconds: float = SECONDS,
) -> SqlResult:
    """Run one SELECT over `tables` (registered under their names)."""
    statement = single_select(text)
    with connection() as con:
        for name, table in tables.items():
            con.register(name, table)
        con.execute("SET lock_configuration = true")
        timer = threading.Timer(seconds, con.interrupt)
        started = time.perf_counter()
        timer.start()
        try:
            cursor = con.execute(statement, params or None)
            rows = cursor.fetchmany(row_limit + 1)
        except duckdb.InterruptException as e:
            raise PodiumError(f"the query ran past the {seconds:g} s limit and was stopped; add a WHERE or a LIMIT") from e
        except duckdb.Error as e:
            raise PodiumError(f"the query failed: {first_line(e)}") from e
        finally:
            timer.cancel()
        columns = tuple(d[0] for d in cursor.description)
    cut = [tuple(preview(value, CELL_CHARS) for value in row) for row in rows[:row_limit]]
    return SqlResult(columns=columns, rows=cut, truncated=len(rows) > row_limit, seconds=time.perf_counter() - started)


def parse_params(text: str) -> list[Any] | dict[str, Any]:
    """SQL parameters from the form: a JSON list (for `?`) or object (for `$name`); empty means none."""
    if not text.strip():
        return []
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise PodiumError(f"parameters must be a JSON list or object: {e}") from e
    if not isinstance(value, list | dict):
        raise PodiumError("parameters must be a JSON list (for ?) or a JSON object (for $name)")
    return value


def first_line(error: Exception) -> str:
    """The first line of a DuckDB error: the message without its context."""
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
