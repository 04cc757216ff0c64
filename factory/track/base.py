"""Experiment tracking behind one small protocol: its config, the run seam, and `open_run`.

A stage logs through a `TrackerRun` and never names a tracking library. `open_run` picks the
backend named in `TrackingConfig` and imports it only then, so importing `factory.track`
costs nothing when tracking is off. A run is keyed by a stable `run_key` (the stage
fingerprint): opening the same key again continues the same tracker run, so a relaunched
stage does not leave a second, half-finished run behind.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, get_args

from factory.errors import ConfigError

Backend = Literal["mlflow", "neptune", "none"]
Status = Literal["finished", "failed"]
BACKENDS: tuple[str, ...] = get_args(Backend)
STATUSES: tuple[str, ...] = get_args(Status)

ENV_BACKEND = "FACTORY_TRACKER"
ENV_URI = "FACTORY_TRACKER_URI"
ENV_PROJECT = "FACTORY_TRACKER_PROJECT"
ENV_NEPTUNE_TOKEN = "NEPTUNE_API_TOKEN"

OPENERS = {"mlflow": "factory.track.mlflow_backend:open_mlflow_run", "neptune": "factory.track.neptune_backend:open_neptune_run"}
"""Each backend's open function, as `module:function`: imported only when that backend is chosen (it imports its tracking
library, and the backend imports this module for the seam it fills)."""
LIBRARIES = {"mlflow": ("mlflow", "mlflow-skinny"), "neptune": ("neptune_scale", "neptune-scale")}
"""The library each backend imports, and the package that installs it."""

# Safe as an MLflow filter literal, a Neptune run_id (no "/") and a directory name.
RUN_KEY_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:=+-]{0,127}")
_NEPTUNE_PROJECT_PATTERN = re.compile(r"[^/\s]+/[^/\s]+")
_SCALAR_TYPES = (str, int, float, bool)


@dataclass(frozen=True, kw_only=True, slots=True)
class TrackingConfig:
    """Where a stage's params, metrics and tags go."""

    backend: Backend = "mlflow"
    """Which tracker: "mlflow" (default), "neptune" (self-hosted Neptune) or "none"."""
    uri: str | None = None
    """MLflow tracking URI; None means a sqlite store under `<root>/mlflow`."""
    project: str | None = None
    """Neptune project as "workspace/project"; required for the neptune backend."""
    experiment: str = "model-factory"
    """MLflow experiment the runs are filed under."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"tracking backend {self.backend!r} is unknown: use one of {', '.join(BACKENDS)}")
        if self.backend == "neptune":
            if self.project is None:
                raise ConfigError(
                    f"the neptune tracker needs a project: set {ENV_PROJECT}=workspace/project "
                    f"(or {ENV_BACKEND}=mlflow)"
                )
            if not _NEPTUNE_PROJECT_PATTERN.fullmatch(self.project):
                raise ConfigError(
                    f"{ENV_PROJECT}={self.project!r} is not a Neptune project: write it as workspace/project"
                )
        if not self.experiment.strip():
            raise ConfigError("the MLflow experiment name is empty: give it a name such as 'model-factory'")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> TrackingConfig:
        """Read FACTORY_TRACKER, FACTORY_TRACKER_URI and FACTORY_TRACKER_PROJECT; unset or empty means default."""
        backend = environ.get(ENV_BACKEND, "").strip().lower() or "mlflow"
        if backend not in BACKENDS:
            raise ConfigError(
                f"{ENV_BACKEND}={environ[ENV_BACKEND]!r} is not a tracker: set it to one of {', '.join(BACKENDS)}"
            )
        uri = environ.get(ENV_URI, "").strip() or None
        project = environ.get(ENV_PROJECT, "").strip() or None
        return cls(backend=backend, uri=uri, project=project)  # type: ignore[arg-type]


class TrackerRun(Protocol):
    """One tracked run: what a stage logs to, whatever the backend."""

    id: str
    url: str

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Record the run's settings; nested mappings become dotted keys."""

    def log_metrics(self, step: int, values: Mapping[str, float]) -> None:
        """Record metric values at one step."""

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Attach or overwrite string labels."""

    def finish(self, status: Status) -> None:
        """Close the run as finished or failed; later calls do nothing."""


class BaseRun:
    """Guards shared by the backends: validation, flattening, finish-once. Subclasses fill the `_` hooks."""

    id: str = ""
    url: str = ""
    _finished: bool = False

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Record the run's settings; nested mappings become dotted keys."""
        self._check_open()
        flat = flatten(params)
        if flat:
            self._log_params(flat)

    def log_metrics(self, step: int, values: Mapping[str, float]) -> None:
        """Record metric values at one step (a non-negative int)."""
        self._check_open()
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"metric step must be a non-negative int, got {step!r}")
        floats = {str(key): float(value) for key, value in values.items()}
        if floats:
            self._log_metrics(step, floats)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Attach or overwrite string labels."""
        self._check_open()
        strings = {str(key): str(value) for key, value in tags.items()}
        if strings:
            self._set_tags(strings)

    def finish(self, status: Status) -> None:
        """Close the run as finished or failed; later calls do nothing."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        if self._finished:
            return
        self._finished = True
        self._finish(status)

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError(f"tracker run {self.id!r} is already finished")

    def _log_params(self, params: dict[str, Any]) -> None:
        raise NotImplementedError

    def _log_metrics(self, step: int, values: dict[str, float]) -> None:
        raise NotImplementedError

    def _set_tags(self, tags: dict[str, str]) -> None:
        raise NotImplementedError

    def _finish(self, status: Status) -> None:
        raise NotImplementedError


class NullRun(BaseRun):
    """The run used when tracking is off: it accepts everything and records nothing."""

    def __init__(self) -> None:
        self.id = ""
        self.url = ""

    def _log_params(self, params: dict[str, Any]) -> None:
        pass

    def _log_metrics(self, step: int, values: dict[str, float]) -> None:
        pass

    def _set_tags(self, tags: dict[str, str]) -> None:
        pass

    def _finish(self, status: Status) -> None:
        pass


def flatten(mapping: Mapping[str, Any], *, sep: str = ".") -> dict[str, Any]:
    """Nested mappings as one level of `sep`-joined keys; str/int/float/bool kept, other values str()'d."""
    flat: dict[str, Any] = {}
    _flatten_into(flat, mapping, prefix="", sep=sep)
    return flat


def _flatten_into(flat: dict[str, Any], mapping: Mapping[str, Any], *, prefix: str, sep: str) -> None:
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            _flatten_into(flat, value, prefix=name + sep, sep=sep)
            continue
        if name in flat:
            raise ValueError(f"two settings flatten to the same key {name!r}")
        flat[name] = value if isinstance(value, _SCALAR_TYPES) else str(value)


def open_run(config: TrackingConfig, root: Path, *, name: str, run_key: str) -> TrackerRun:
    """Open (or continue, for a `run_key` seen before and not finished) a tracker run."""
    if not RUN_KEY_PATTERN.fullmatch(run_key):
        raise ValueError(f"run_key must match {RUN_KEY_PATTERN.pattern}, got {run_key!r}")
    if config.backend == "none":
        return NullRun()
    options = {"api_token": os.environ.get(ENV_NEPTUNE_TOKEN) or None} if config.backend == "neptune" else {}
    return _opener(config.backend)(config, Path(root), name=name, run_key=run_key, **options)


def _opener(backend: str) -> Callable[..., TrackerRun]:
    """The backend's open function, imported now (and with it its tracking library)."""
    module, function = OPENERS[backend].split(":")
    try:
        return getattr(importlib.import_module(module), function)
    except ModuleNotFoundError as e:
        library, package = LIBRARIES[backend]
        if (e.name or "").split(".")[0] == library:
            raise ConfigError(
                f"the chosen tracker needs the {package} package: pip install {package}, or set {ENV_BACKEND}=none"
            ) from e
        raise
