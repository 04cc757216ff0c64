"""How a stage process talks back (Dagster Pipes when launched by Dagster, the console otherwise), and how it ends."""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any, Protocol

from dagster_pipes import DAGSTER_PIPES_CONTEXT_ENV_VAR, PipesContext, open_dagster_pipes


class Reporter(Protocol):
    """The stage's voice: a logger, metrics and the final materialization."""

    log: logging.Logger

    def metrics(self, step: int, values: dict[str, float]) -> None:
        """Report training metrics at a step."""

    def materialized(self, metadata: dict[str, Any], data_version: str) -> None:
        """Report the published artifact."""


class _PipesLogHandler(logging.Handler):
    def __init__(self, pipes: PipesContext) -> None:
        super().__init__()
        self.pipes = pipes

    def emit(self, record: logging.LogRecord) -> None:
        level = "warning" if record.levelno >= logging.WARNING else "info"
        getattr(self.pipes.log, level)(self.format(record))


class PipesReporter:
    """Reports through Dagster Pipes: logs and materializations appear in the Dagster run."""

    def __init__(self, pipes: PipesContext, log: logging.Logger) -> None:
        self.pipes = pipes
        self.log = log

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self.pipes.report_custom_message({"step": step, **values})

    def materialized(self, metadata: dict[str, Any], data_version: str) -> None:
        self.pipes.report_asset_materialization(metadata=metadata, data_version=data_version)


class ConsoleReporter:
    """Reports to the terminal, for a stage run by hand."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log

    def metrics(self, step: int, values: dict[str, float]) -> None:
        pass  # the trainer already logs each report

    def materialized(self, metadata: dict[str, Any], data_version: str) -> None:
        print(json.dumps({"data_version": data_version, "metadata": metadata}, indent=2, default=str))


@contextlib.contextmanager
def open_reporter(name: str) -> Iterator[Reporter]:
    """Pipes when the Dagster launcher set up the channel; plain logging to stderr otherwise."""
    log = logging.getLogger(f"factory.stage.{name}")
    log.setLevel(logging.INFO)
    log.propagate = False
    rank = os.environ.get("RANK", "0")
    if DAGSTER_PIPES_CONTEXT_ENV_VAR not in os.environ or rank != "0":  # only rank 0 talks to Dagster
        stderr = logging.StreamHandler(sys.stderr)
        prefix = f"[rank {rank}] " if rank != "0" else ""
        stderr.setFormatter(logging.Formatter(f"%(asctime)s %(name)s {prefix}%(message)s", "%H:%M:%S"))
        with _handler(log, stderr):
            yield ConsoleReporter(log)
        return
    with open_dagster_pipes() as pipes, _handler(log, _PipesLogHandler(pipes)):
        yield PipesReporter(pipes, log)


@contextlib.contextmanager
def _handler(log: logging.Logger, handler: logging.Handler) -> Iterator[None]:
    log.addHandler(handler)
    try:
        yield
    finally:
        log.removeHandler(handler)


def exit_now(code: int) -> None:
    """End a stage process (or an orchestrating one) without tearing the interpreter down: what it made is published
    and fsynced, so only exit handlers and buffered output matter, and unloading torch, pyarrow or Dagster module by
    module takes about a second."""
    atexit._run_exitfuncs()  # what a normal exit runs first (the tracker's and logging's handlers), then no module teardown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
