"""Launch a stage process through Dagster Pipes: its logs and materialization flow back to the run."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from dagster import (
    AssetExecutionContext,
    ConfigurableResource,
    Failure,
    MaterializeResult,
    MetadataValue,
    PipesExecutionResult,
    PipesSession,
    PipesTempFileContextInjector,
    PipesTempFileMessageReader,
    open_pipes_session,
)

from factory.config import Experiment
from factory.errors import FactoryError
from factory.launch import LocalLauncher, stage_argv
from factory.stages import EVALUATE_MODULE
from factory.stages.eval_request import EvalRequest
from factory.stages.request import StageRequest



class StageLauncher(ConfigurableResource):
    """Runs `python -m factory.stages` as a local child process (the embedded default)."""

    def launch(
        self, context: AssetExecutionContext, request: StageRequest, on_poll: Callable[[], None] | None = None,
        experiment: Experiment | None = None,
    ) -> Iterator[PipesExecutionResult]:
        """Run the stage; yield what it reported. A failed stage becomes a Dagster Failure.

        `on_poll` runs in this thread about every second while the stage runs (to record its checkpoints as they appear).
        `experiment`: what the stage belongs to (a cluster launcher places it by its resources; this one needs only the request).
        """
        kind = request.spec.kind
        with tempfile.TemporaryDirectory(prefix=f"factory-{kind}-") as tmp:
            try:
                argv = stage_argv(request.write(Path(tmp) / "request.json"), processes=request.processes, nodes=request.nodes)
            except FactoryError as e:
                raise Failure(description=str(e)) from e
            yield from _run_with_pipes(context, argv, kind, on_poll)

    def evaluate(self, context: AssetExecutionContext, request: EvalRequest) -> Iterator[PipesExecutionResult]:
        """Evaluate a batch of checkpoint x benchmark pairs in one process; yield what it reported."""
        with tempfile.TemporaryDirectory(prefix="factory-evaluations-") as tmp:
            argv = [sys.executable, "-m", EVALUATE_MODULE, str(request.write(Path(tmp) / "request.json"))]
            yield from _run_with_pipes(context, argv, "evaluations", None)


def _run_with_pipes(
    context: AssetExecutionContext, argv: list[str], name: str, on_poll: Callable[[], None] | None
) -> Iterator[PipesExecutionResult]:
    with open_pipes_session(
        context=context,
        context_injector=PipesTempFileContextInjector(),
        message_reader=PipesTempFileMessageReader(),
    ) as session:
        try:
            LocalLauncher().run(argv, session.get_bootstrap_env_vars(), name, on_poll=on_poll)
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
