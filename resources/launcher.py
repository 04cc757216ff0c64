"""Launch a stage process through Dagster Pipes: its logs and materialization flow back to the run.

Pipes keeps a stage's custom messages until it ends; a stage's checkpoints cannot wait that long (their evaluations
start while training goes on), so `PipesMessageTap` hands each custom message to a callback as it arrives, whatever
carries it (a temp file here, the master pod's log on a cluster).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from dagster import (
    AssetExecutionContext,
    ConfigurableResource,
    Failure,
    MaterializeResult,
    MetadataValue,
    PipesExecutionResult,
    PipesMessageReader,
    PipesSession,
    PipesTempFileContextInjector,
    PipesTempFileMessageReader,
    open_pipes_session,
)
from dagster._core.pipes.context import PipesMessageHandler
from dagster_pipes import PipesParams

from factory.config import Experiment
from factory.errors import FactoryError
from factory.config.stages import pool_of
from factory.launch import LocalLauncher, stage_argv
from factory.launch.slots import pool_slot
from factory.runtime import tracker_backend, warm_modules
from factory.runtime.request import StageRequest

SLOTS_DIR = "pool-slots"
"""Under the instance's directory: the slot files of each pool (`machine_slot`)."""
MessageSink = Callable[[Any], bool]
"""Hears a stage's custom message as it arrives; True when it took the message (it is then not kept for the end)."""
_AHEAD: list[str] = []
"""Modules this process imports beside its next stage (`import_beside_the_next_stage`)."""


def import_beside_the_next_stage(modules: Sequence[str]) -> None:
    """Have this process import `modules` while its next stage runs, instead of on the run's clock after it (the process
    only waits for the stage meanwhile); one that fails is imported again where it is needed, and says why there."""
    _AHEAD.extend(modules)


@contextlib.contextmanager
def beside_the_stage() -> Iterator[None]:
    """Around a stage's run: a thread imports the modules asked for (`import_beside_the_next_stage`), and the launch waits
    for it before it goes on, so that nothing else of this process imports at the same time (two threads importing parts of
    one import cycle at once get a deadlock error, or a module half made, in one of them)."""
    modules, _AHEAD[:] = list(_AHEAD), []

    def load() -> None:
        for module in modules:
            with contextlib.suppress(Exception):
                importlib.import_module(module)

    thread = threading.Thread(target=load, name="import-ahead", daemon=True) if modules else None
    if thread is not None:
        thread.start()
    try:
        yield
    finally:
        if thread is not None:
            thread.join()


class StageLauncher(ConfigurableResource):
    """Runs `python -m factory.runtime` as a local child process (the embedded default)."""

    def launch(
        self, context: AssetExecutionContext, request: StageRequest, on_message: MessageSink | None = None,
        experiment: Experiment | None = None,
    ) -> Iterator[PipesExecutionResult]:
        """Run the stage; yield what it reported. A failed stage becomes a Dagster Failure.

        `on_message` hears each custom message of the stage as it arrives, on the thread reading them (its checkpoints).
        `experiment`: what the stage belongs to (a cluster launcher places it by its resources; this one needs only the
        request); None for a stage of no one experiment (an evaluation batch).
        """
        kind = request.spec.kind
        with tempfile.TemporaryDirectory(prefix=f"factory-{kind}-") as tmp, machine_slot(context, pool_of(kind), kind):
            try:
                argv = stage_argv(request.write(Path(tmp) / "request.json"), processes=request.processes, nodes=request.nodes)
            except FactoryError as e:
                raise Failure(description=str(e)) from e
            yield from run_with_pipes(context, argv, kind, on_message, warm_modules([kind], tracker_backend(os.environ)))


@contextlib.contextmanager
def machine_slot(context: AssetExecutionContext, pool: str | None, stage: str) -> Iterator[None]:
    """Hold a slot of `pool` on this machine (`factory.launch.slots`) while a stage of it runs, as many as the instance's
    limit of the pool; nothing for a stage of no pool, or a pool the instance does not limit."""
    storage = context.instance.event_log_storage
    limits = {limit.name: limit.limit for limit in storage.get_pool_limits()} if pool and storage.supports_global_concurrency_limits else {}
    if pool not in limits:
        yield
        return
    where = Path(context.instance.root_directory) / SLOTS_DIR
    run = context.run
    holder = f"{run.tags.get('experiment') or run.tags.get('dagster/partition') or 'a run'} (run {run.run_id[:8]})"

    def waiting(held_by: list[str]) -> None:
        by = ", ".join(held_by) or "a process of this machine"
        context.log.info(f"{stage}: waiting for a slot of pool {pool} on this machine, held by {by} ({limits[pool]} at a time)")

    with pool_slot(where, pool, limits[pool], waiting, holder):
        yield


def run_with_pipes(
    context: AssetExecutionContext, argv: list[str], name: str, on_message: MessageSink | None, needs: Sequence[str] = ()
) -> Iterator[PipesExecutionResult]:
    """Run `argv` as a local process talking back through Pipes (`on_message`: see `launch`; `needs`, the modules it will
    import: see `LocalLauncher.run`); yield what it reported."""
    reader = PipesTempFileMessageReader()
    with open_pipes_session(
        context=context,
        context_injector=PipesTempFileContextInjector(),
        message_reader=PipesMessageTap(reader, on_message) if on_message else reader,
    ) as session:
        try:
            with beside_the_stage():
                LocalLauncher().run(argv, session.get_bootstrap_env_vars(), name, needs)
        except FactoryError as e:
            raise Failure(description=str(e)) from e
    yield from pipes_results(session)


def pipes_results(session: PipesSession) -> Iterator[PipesExecutionResult]:
    """What a finished stage reported; its metrics messages ride on its materialization."""
    metrics = session.get_custom_messages()
    for result in session.get_results():
        if metrics and isinstance(result, MaterializeResult):
            result = result._replace(metadata={**(result.metadata or {}), "metrics": MetadataValue.json(metrics)})
        yield result


class PipesMessageTap(PipesMessageReader):
    """Another reader's messages, each custom message offered to `on_message` as it arrives before Pipes keeps it."""

    def __init__(self, reader: PipesMessageReader, on_message: MessageSink) -> None:
        self.reader = reader
        self.on_message = on_message

    @contextlib.contextmanager
    def read_messages(self, handler: PipesMessageHandler) -> Iterator[PipesParams]:
        with self.reader.read_messages(_TappedHandler(handler, self.on_message)) as params:  # a reader needs only what it wraps
            yield params

    def on_opened(self, opened_payload: Any) -> None:
        self.reader.on_opened(opened_payload)

    def on_launched(self, launched_payload: Any) -> None:
        self.reader.on_launched(launched_payload)

    @property
    def expected_writer_count(self) -> int:
        return self.reader.expected_writer_count

    def no_messages_debug_text(self) -> str:
        return self.reader.no_messages_debug_text()


class _TappedHandler:
    """The session's handler as a reader sees it, with custom messages offered to the tap first (as Dagster's own
    composite reader wraps it)."""

    def __init__(self, handler: PipesMessageHandler, on_message: MessageSink) -> None:
        self.handler = handler
        self.on_message = on_message

    def handle_message(self, message: Any) -> None:
        if message.get("method") == "report_custom_message" and self.on_message((message.get("params") or {}).get("payload")):
            return
        self.handler.handle_message(message)

    def report_pipes_framework_exception(self, origin: str, exc_info: Any) -> None:
        self.handler.report_pipes_framework_exception(origin, exc_info)

    @property
    def _context(self) -> AssetExecutionContext:
        return self.handler._context  # threaded readers log through it

    @property
    def received_opened_message(self) -> bool:
        return self.handler.received_opened_message

    @property
    def received_closed_message(self) -> bool:
        return self.handler.received_closed_message
