"""The SQL box's rules: one read-only SELECT, on a DuckDB that cannot touch files, under row and time limits.

The statement is parsed first and refused unless it is exactly one SELECT whose parse tree holds
nothing but reads (a COPY inside a WITH is refused too). The connection has external access
(files, URLs, `ATTACH`, extensions) disabled and its configuration locked before the query runs;
a timer interrupts it past its time; at most `row_limit` rows come back, each cell cut to
`CELL_CHARS` characters. `factory.podium.worker` runs all of this in a process of its own.
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
MAX_QUERY_CHARS = 100_000
SPILL_LIMIT = "2GB"
READ_ONLY_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})
"""Parse-tree query nodes that only read; any other (COPY, INSERT, DELETE, UPDATE, ...) is refused."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SqlResult:
    """What a SELECT returned, up to the row limit; cells as `preview` gives them."""

    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    truncated: bool
    seconds: float


def connection(memory_limit: str = "2GB", spill_to: str | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB that cannot read or write files, load extensions or attach databases.

    `spill_to` is a folder of its own for what a query spills past `memory_limit` (at most SPILL_LIMIT).
    """
    config = {"enable_external_access": False, "autoload_known_extensions": False, "autoinstall_known_extensions": False,
              "memory_limit": memory_limit, "threads": 2}
    if spill_to:
        config |= {"temp_directory": spill_to, "max_temp_directory_size": SPILL_LIMIT}
    con = duckdb.connect(config=config)
    con.execute("SET enable_progress_bar = false")
    return con


def single_select(text: str) -> str:
    """The text's one statement, when it is a read-only SELECT throughout; anything else is refused with the reason.

    DuckDB's own parse tree is checked, not the statement's first word: a CTE or subquery may hold
    a COPY, INSERT or DELETE inside a statement DuckDB still calls a SELECT.
    """
    if len(text) > MAX_QUERY_CHARS:
        raise PodiumError(f"the query is {len(text)} characters long; at most {MAX_QUERY_CHARS} are accepted")
    try:
        statements = duckdb.extract_statements(text)
    except duckdb.Error as e:
        raise PodiumError(f"the query does not parse: {first_line(e)}") from e
    if len(statements) != 1:
        raise PodiumError(f"write exactly one statement; found {len(statements)}")
    if statements[0].type != duckdb.StatementType.SELECT:
        raise PodiumError(f"only SELECT queries run here; this is a {statements[0].type.name} statement")
    with duckdb.connect(config={"enable_external_access": False}) as con:
        serialized = con.execute("SELECT json_serialize_sql(?)", [statements[0].query]).fetchall()[0][0]
    try:
        tree = json.loads(serialized)
    except RecursionError as e:  # ~300 subqueries inside each other pass DuckDB's parser but not Python's JSON decoder
        raise PodiumError("the query nests too deep to be checked (subqueries or parentheses inside each other); "
                          "name the inner queries in a WITH clause instead") from e
    if tree.get("error"):
        raise PodiumError(f"only SELECT queries run here: {tree.get('error_message', 'the statement is not a plain SELECT')}")
    found = sorted(query_nodes(tree) - READ_ONLY_NODES)
    if found:
        kinds = ", ".join(n.removesuffix("_NODE").removesuffix("_QUERY").replace("_", " ") for n in found)
        raise PodiumError(f"only SELECT queries run here; this one holds {kinds} inside (in a WITH or a subquery)")
    return statements[0].query


def query_nodes(tree: Any) -> set[str]:
    """Every query node type (`SELECT_NODE`, `COPY_QUERY_NODE`, ...) anywhere in a serialized parse tree."""
    found: set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            kind = node.get("type")
            if isinstance(kind, str) and kind.endswith("_NODE"):
                found.add(kind)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def execute(
    con: duckdb.DuckDBPyConnection, statement: str, params: Sequence[Any] | Mapping[str, Any] = (),
    row_limit: int = ROW_LIMIT, seconds: float = SECONDS,
) -> SqlResult:
    """Run a statement `single_select` passed on a prepared connection, interrupted past `seconds`."""
    timer = threading.Timer(seconds, con.interrupt)
    started = time.perf_counter()
    timer.start()
    try:
        cursor = con.execute(statement, params or None)
        rows = cursor.fetchmany(row_limit + 1)
        columns = tuple(d[0] for d in cursor.description)
    except duckdb.InterruptException as e:
        raise PodiumError(f"the query ran past the {seconds:g} s limit and was stopped; add a WHERE or a LIMIT") from e
    except duckdb.OutOfMemoryException as e:
        raise PodiumError(f"the query needed more memory than the SQL box allows ({first_line(e)}); "
                          "add a WHERE or a LIMIT, or build smaller values") from e
    except duckdb.Error as e:
        raise PodiumError(f"the query failed: {first_line(e)}") from e
    finally:
        timer.cancel()
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
