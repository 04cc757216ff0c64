"""The Volcano launcher resource: each stage a Volcano Job on Kubernetes, reporting back through Dagster Pipes.

dagster-k8s creates Pods and batch/v1 Jobs only; this is the Pipes client for Volcano Jobs. The Pipes context
goes into every pod's environment; rank 0 (in the master pod) writes its messages to stdout, and they come back
in the master's log, which `VolcanoJobs` follows; a checkpoint's message is recorded as its line arrives, so nothing
reads the pods' disks. The last log lines (plain lines, and the text of Pipes log
messages) are quoted when the stage fails.

An evaluation batch is a stage too (a Job of its own, never work inside the Dagster run's pod): it is placed by the
profile's `kubernetes.evaluations`, in the code location's image.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from dagster import AssetExecutionContext, Failure, PipesEnvContextInjector, PipesExecutionResult, PipesMessageReader, open_pipes_session
from dagster._core.pipes.context import PipesMessageHandler
from dagster_pipes import PIPES_PROTOCOL_VERSION_FIELD, PipesParams

from factory.config import Experiment
from factory.config.cluster import KubernetesSettings, load_profile
from factory.config.kinds import stage_kind
from factory.errors import FactoryError
from factory.runtime.request import StageRequest
from resources.launcher import MessageSink, PipesMessageTap, StageLauncher, beside_the_stage, pipes_results


class VolcanoStageLauncher(StageLauncher):
    """Runs training and data stages as Volcano Jobs on the cluster a profile's `kubernetes` section describes."""

    profile: str
    """The cluster profile (YAML; see factory.config.cluster): `launcher: volcano` and a `kubernetes` section."""

    def settings(self) -> KubernetesSettings:
        """The profile's kubernetes section (a Failure saying what to add when it has none)."""
        try:
            profile = load_profile(Path(self.profile))
        except FactoryError as e:
            raise Failure(description=str(e)) from e
        if profile.kubernetes is None:
            raise Failure(description=f"{self.profile}: the volcano launcher needs a `kubernetes:` section (namespace, kubeconfig or "
                                      "in_cluster, image_registry, storage); see deploy/README.md")
        return profile.kubernetes

    def engine_env(self) -> dict[str, str]:
        """What each stage's pod is told of the data engine: the profile's Ray cluster, when it names one."""
        ray = load_profile(Path(self.profile)).ray
        return ray.environ() if ray is not None else {}

    def launch(
        self, context: AssetExecutionContext, request: StageRequest, on_message: MessageSink | None = None,
        experiment: Experiment | None = None,
    ) -> Iterator[PipesExecutionResult]:
        """Submit the stage's Job, follow it through Pipes until it ends, delete it; a failed Job is a Dagster Failure."""
        kind = stage_kind(request.spec.kind)
        if experiment is None and kind.scope == "experiment":
            raise Failure(description=f"{kind.name}: the volcano launcher places a stage by its experiment, and none was given")
        from factory.launch.volcano import batch_job_spec, cluster_job_spec, job_manifest  # the Kubernetes client, only where Jobs are submitted
        from factory.launch.volcano_client import VolcanoJobs, connect

        settings = self.settings()
        reader = PipesLogLineReader()
        tapped = PipesMessageTap(reader, on_message) if on_message else reader
        with open_pipes_session(context=context, context_injector=PipesEnvContextInjector(), message_reader=tapped) as session:
            try:
                env = {**self.engine_env(), **session.get_bootstrap_env_vars()}
                spec = (cluster_job_spec(experiment, request.spec, settings, env=env) if experiment is not None
                        else batch_job_spec(request.spec, settings, os.environ.get("DAGSTER_CURRENT_IMAGE"), env=env))
                jobs = VolcanoJobs(connect(settings.kubeconfig, settings.in_cluster, settings.context), settings.namespace, context.log,
                                   poll_s=settings.poll_s, schedule_timeout_s=settings.schedule_timeout_s)
                with beside_the_stage():
                    jobs.run(job_manifest(spec), json.dumps(request.to_json()), reader.feed)
            except FactoryError as e:
                raise Failure(description=str(e)) from e
        yield from pipes_results(session)


def launcher_from_env() -> StageLauncher:
    """The volcano launcher when $FACTORY_CLUSTER names a profile with `launcher: volcano`; the local one otherwise."""
    path = os.environ.get("FACTORY_CLUSTER")
    if path and load_profile(Path(path)).launcher == "volcano":
        return VolcanoStageLauncher(profile=path)
    return StageLauncher()


class PipesLogLineReader(PipesMessageReader):
    """Pipes messages read from log lines the launcher hands over (`feed`): the stage writes them to its stdout."""

    def __init__(self) -> None:
        self._handler: PipesMessageHandler | None = None

    @contextlib.contextmanager
    def read_messages(self, handler: PipesMessageHandler) -> Iterator[PipesParams]:
        self._handler = handler
        try:
            yield {"stdio": "stdout"}
        finally:
            self._handler = None

    def feed(self, line: str) -> str | None:
        """Hand one log line over: a Pipes message is handled. Returns what the line says to a person (a plain line,
        or the text of a Pipes log message), None for other messages."""
        text = line.strip()
        if self._handler is None or not text.startswith("{"):
            return line
        try:
            message = json.loads(text)
        except ValueError:
            return line
        if not isinstance(message, dict) or PIPES_PROTOCOL_VERSION_FIELD not in message:
            return line
        self._handler.handle_message(message)
        return message["params"].get("message") if message.get("method") == "log" and message.get("params") else None

    def no_messages_debug_text(self) -> str:
        return "Pipes messages were expected on the master pod's stdout, in its log: did rank 0 of the stage start?"
