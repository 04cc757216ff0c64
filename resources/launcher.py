"""Launch a stage process through Dagster Pipes: its logs and materialization flow back to the run."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

from dagster import (
    AssetExecutionContext,
    ConfigurableResource,
    Failure,
    MaterializeResult,
    MetadataValue,
    PipesExecutionResult,
    PipesTempFileContextInjector,
    PipesTempFileMessageReader,
    open_pipes_session,
)

from factory.errors import FactoryError
from factory.launch import LocalLauncher, stage_argv
from factory.stages.request import StageRequest


class StageLauncher(ConfigurableResource):
    """Runs `python -m factory.stages` as a local child process (the embedded default)."""

    def launch(self, context: AssetExecutionContext, request: StageRequest) -> Iterator[PipesExecutionResult]:
        """Run the stage; yield what it reported. A failed stage becomes a Dagster Failure."""
        kind = request.spec.kind
        with tempfile.TemporaryDirectory(prefix=f"factory-{kind}-") as tmp:
            try:
                argv = stage_argv(request.write(Path(tmp) / "request.json"), processes=request.processes, nodes=request.nodes)
            except FactoryError as e:
                raise Failure(description=str(e)) from e
            with open_pipes_session(
                context=context,
                context_injector=PipesTempFileContextInjector(),
                message_reader=PipesTempFileMessageReader(),
            ) as session:
                try:
                    LocalLauncher().run(argv, session.get_bootstrap_env_vars(), kind)
                except FactoryError as e:
                    raise Failure(description=str(e)) from e
            metrics = session.get_custom_messages()
            for result in session.get_results():
                if metrics and isinstance(result, MaterializeResult):
                    result = result._replace(metadata={**(result.metadata or {}), "metrics": MetadataValue.json(metrics)})
                yield result
