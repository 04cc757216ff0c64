"""How a stage process talks back (Dagster Pipes when launched by Dagster, the console otherwise), and how it ends."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any, Protocol

from dagster_pipes import DAGSTER_PIPES_CONTEXT_ENV_VAR, PipesContext, open_dagster_pipes

from factory.train.records import CheckpointEvent, checkpoint_message


class Reporter(Protocol):
    """The stage's voice: a logger, metrics, checkpoints as they are saved and deleted, and the final materialization."""

    log: logging.Logger

    def metrics(self, step: int, values: dict[str, float]) -> None:
        """Report training metrics at a step."""

    def checkpoint(self, event: CheckpointEvent) -> None:
        """Report a checkpoint just saved (its record written) or deleted by retention."""

    def materialized(self, metadata: dict[str, Any], data_version: str) -> None:
        """Report the published artifact."""


class _PipesLogHandler(logging.Handler):
    def __init__(self, pipes: PipesContext, lock: threading.Lock) -> None:
        super().__init__()
        self.pipes = pipes
        self.sending = lock

    def emit(self, record: logging.LogRecord) -> None:
        level = "warning" if record.levelno >= logging.WARNING else "info"
        with self.sending:
            getattr(self.pipes.log, level)(self.format(record))


class PipesReporter:
    """Reports through Dagster Pipes: logs and materializations appear in the Dagster run, each checkpoint as it is saved.

    An asynchronous checkpoint save reports from its own thread: one lock keeps each message whole on the channel.
    """

    def __init__(self, pipes: PipesContext, log: logging.Logger, lock: threading.Lock) -> None:
        self.pipes = pipes
        self.log = log
        self.sending = lock

    def metrics(self, step: int, values: dict[str, float]) -> None:
        with self.sending:
            self.pipes.report_custom_message({"step": step, **values})

    def checkpoint(self, event: CheckpointEvent) -> None:
        with self.sending:
            self.pipes.report_custom_message(checkpoint_message(event))

    def materialized(self, metadata: dict[str, Any], data_version: str) -> None:
        with self.sending:
            self.pipes.report_asset_materialization(metadata=metadata, data_version=data_version)


class ConsoleReporter:
    """Reports to the terminal, for a stage run by hand."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log

    def metrics(self, step: int, values: dict[str, float]) -> None:
        pass  # the trainer already logs each report

    def checkpoint(self, event: CheckpointEvent) -> None:
        pass  # on disk, in the work directory; the artifact lists the kept ones

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
    lock = threading.Lock()
    with open_dagster_pipes() as pipes, _handler(log, _PipesLogHandler(pipes, lock)):
        yield PipesReporter(pipes, log, lock)


@contextlib.contextmanager
def _handler(log: logging.Logger, handler: logging.Handler) -> Iterator[None]:
    log.addHandler(handler)
    try:
        yield
    finally:
        log.removeHandler(handler)


