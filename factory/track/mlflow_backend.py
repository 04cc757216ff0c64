"""The MLflow tracker: a sqlite store under `<root>/mlflow` by default, or any tracking URI.

Each run talks through its own `MlflowClient(tracking_uri=...)`, never MLflow's global fluent
state, so two runs in one process (or a test next to a stage) do not interfere. A run is
tagged `factory.run_key`; opening that key again resumes the newest run with it that is not
FINISHED (a relaunched or crashed stage), and starts a new one once the last has finished.
MLflow params are write-once: re-logging a key with a different value is refused by MLflow.

A new local store is a copy of an empty one MLflow made once for this user and its version (`STORE_TEMPLATE_DIR`):
MLflow makes one by creating its first tables and applying every migration since, about a second of CPU that each new
root's first training stage paid. The copy is what MLflow makes (its tables and schema revision; the experiment
`Default` it adds on its first open, with this root's artifact location).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# The sqlite store's code (its SQLAlchemy models and mappers, alembic), which MlflowClient imports when it opens a local
# store: seconds of every training stage's start. Imported with this module, a warm interpreter loads it once for all.
import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
import requests
import sqlalchemy
from mlflow.entities import LifecycleStage, Metric, Param, RunStatus, RunTag, ViewType
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode
from mlflow.store.db.utils import _initialize_tables
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH
from mlflow.version import VERSION as MLFLOW_VERSION

from factory.errors import ConfigError
from factory.registry import STORE_ENV
from factory.track.base import BaseRun, Status, TrackingConfig

RUN_KEY_TAG = "factory.run_key"
SERVER_CHECK_TIMEOUT_S = 10.0
STORE_DIR = "mlflow"
STORE_FILE = "mlflow.db"
STORE_TEMPLATE_DIR = "model-factory"
"""Under the user's cache directory (`$XDG_CACHE_HOME`, default `~/.cache`): `mlflow-<version>.db`, the empty store new
roots' stores are copied from."""
# MLflow narrates creating and migrating a sqlite store at INFO; the training log has no use for it.
_CHATTY_LOGGERS = ("mlflow.store.db.utils", "alembic")
_STATUS = {"finished": RunStatus.to_string(RunStatus.FINISHED), "failed": RunStatus.to_string(RunStatus.FAILED)}


class MlflowRun(BaseRun):
    """One MLflow run, logged through its own client."""

    def __init__(self, client: MlflowClient, *, run_id: str, experiment_id: str, uri: str) -> None:
        self._client = client
        self.id = run_id
        self.url = run_url(uri, experiment_id=experiment_id, run_id=run_id)

    def _log_params(self, params: dict[str, Any]) -> None:
        entries = [Param(key, str(value)[:MAX_PARAM_VAL_LENGTH]) for key, value in params.items()]
        self._client.log_batch(self.id, params=entries, synchronous=True)

    def _log_metrics(self, step: int, values: dict[str, float]) -> None:
        now_ms = int(time.time() * 1000)
        entries = [Metric(key, value, now_ms, step) for key, value in values.items()]
        self._client.log_batch(self.id, metrics=entries, synchronous=True)

    def _set_tags(self, tags: dict[str, str]) -> None:
        entries = [RunTag(key, value[:MAX_TAG_VAL_LENGTH]) for key, value in tags.items()]
        self._client.log_batch(self.id, tags=entries, synchronous=True)

    def _finish(self, status: Status) -> None:
        self._client.set_terminated(self.id, status=_STATUS[status])


def open_mlflow_run(config: TrackingConfig, root: Path, *, name: str, run_key: str) -> MlflowRun:
    """Resume the unfinished run tagged `run_key` in the configured experiment, or start one."""
    uri, artifacts = store_location(config, root)
    if _is_http(uri):
        _check_reachable(uri)
    try:
        with _quiet_store_setup():
            client = MlflowClient(tracking_uri=uri)
            experiment_id = _experiment_id(client, config.experiment, artifacts)
    except MlflowException as e:
        raise ConfigError(
            f"the MLflow tracking store {uri!r} could not be opened ({e.message}): "
            f"fix FACTORY_TRACKER_URI, or unset it to use the local sqlite store"
        ) from e
    run_id = _unfinished_run_id(client, experiment_id, run_key)
    if run_id is None:
        run = client.create_run(experiment_id, run_name=name, tags={RUN_KEY_TAG: run_key})
        run_id = run.info.run_id
    else:
        client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
    return MlflowRun(client, run_id=run_id, experiment_id=experiment_id, uri=uri)


def store_location(config: TrackingConfig, root: Path) -> tuple[str, str | None]:
    """The tracking URI and, unless a server decides it, the artifact location for new experiments: `<store>/mlflow`
    when `$FACTORY_STORE` names an object store, else under the root."""
    object_store = os.environ.get(STORE_ENV, "").strip().rstrip("/")
    artifacts = f"{object_store}/mlflow" if "://" in object_store else (root / STORE_DIR / "artifacts").resolve().as_uri()
    if config.uri is None:
        store = (root / STORE_DIR).resolve()
        store.mkdir(parents=True, exist_ok=True)
        _new_store(store / STORE_FILE)
        return f"sqlite:///{store / STORE_FILE}", artifacts
    if _is_http(config.uri):
        return config.uri, None
    if config.uri.startswith("sqlite:///"):
        Path(config.uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return config.uri, artifacts


def _new_store(path: Path) -> None:
    """Where no store is at `path` yet, the empty one MLflow made (`_store_template`), copied there unless another process
    put one there first. Without a cache directory to keep it in, MLflow makes the store itself, as before."""
    if path.exists():
        return
    copy = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    try:
        shutil.copyfile(_store_template(), copy)
        os.link(copy, path)  # never over a store another process made meanwhile
    except Exception:  # noqa: BLE001  (one is there now, or none could be made or copied: no home, a full disk, a
        pass  # failed migration... MLflow makes the store itself, as it did before, and says what fails if it cannot)
    finally:
        copy.unlink(missing_ok=True)


def _store_template() -> Path:
    """The empty store of this MLflow version as MLflow makes it (its first tables, then every migration), made the
    first time it is asked for and kept in the user's cache directory."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / STORE_TEMPLATE_DIR
    template = cache / f"mlflow-{MLFLOW_VERSION}.db"
    if template.is_file():
        return template
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".mlflow-") as scratch:
        made = Path(scratch) / STORE_FILE
        engine = sqlalchemy.create_engine(f"sqlite:///{made}")
        try:
            with _quiet_store_setup():
                _initialize_tables(engine)
        finally:
            engine.dispose()
        os.replace(made, template)  # whole, or not there
    return template


def run_url(uri: str, *, experiment_id: str, run_id: str) -> str:
    """A link to the run in the MLflow UI for a server URI, else a locator for a local store."""
    if _is_http(uri):
        return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
    return f"mlflow run {run_id} in {uri}"


def _experiment_id(client: MlflowClient, name: str, artifact_location: str | None) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None and experiment.lifecycle_stage == LifecycleStage.DELETED:
        raise ConfigError(
            f"MLflow experiment {name!r} is deleted: restore it (mlflow experiments restore) or pick another name"
        )
    if experiment is not None:
        return experiment.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except MlflowException as e:
        if e.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
            raise
    experiment = client.get_experiment_by_name(name)  # another process created it just now
    assert experiment is not None
    return experiment.experiment_id


def _unfinished_run_id(client: MlflowClient, experiment_id: str, run_key: str) -> str | None:
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{RUN_KEY_TAG}` = '{run_key}'",
        run_view_type=ViewType.ACTIVE_ONLY,
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if runs and runs[0].info.status != RunStatus.to_string(RunStatus.FINISHED):
        return runs[0].info.run_id
    return None


def _check_reachable(uri: str) -> None:
    # MLflow retries a dead server with backoff for minutes (measured: ~250 s) before it gives up.
    try:
        requests.get(f"{uri.rstrip('/')}/health", timeout=SERVER_CHECK_TIMEOUT_S)
    except requests.RequestException as e:
        raise ConfigError(
            f"no MLflow server answers at {uri} ({type(e).__name__}): start it, fix FACTORY_TRACKER_URI, "
            f"or unset it to use the local sqlite store"
        ) from e


def _is_http(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


@contextlib.contextmanager
def _quiet_store_setup() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in _CHATTY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
