"""The Neptune tracker, through the `neptune-scale` client, for self-hosted Neptune installations.

The hosted neptune.ai service shut down in March 2026; this backend is for teams that run
their own Neptune server. With an API token (env NEPTUNE_API_TOKEN, which also names the
server) a run streams to that server ("async" mode); without one it is written offline to
sqlite files under `<root>/neptune/<run_key>/`, which `neptune sync <file>` uploads later.
The Neptune run id is the `run_key`, and neptune-scale continues an existing run with the
same id, so a relaunched stage appends to the run it started. Params land under `params/`,
tags under `tags/`, the run name in `name`, the final status in `status`; metric names are
used as given.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from neptune_scale import Run

from factory.errors import ConfigError
from factory.track.base import BaseRun, Status, TrackingConfig

STORE_DIR = "neptune"
PARAMS_NAMESPACE = "params/"
TAGS_NAMESPACE = "tags/"
STATUS_ATTRIBUTE = "status"
NAME_ATTRIBUTE = "name"  # not sys/name: in Neptune 3 that is the experiment name, set only for experiments


class NeptuneRun(BaseRun):
    """One Neptune run, online or offline."""

    def __init__(self, run: Run, *, run_id: str, url: str, offline: bool) -> None:
        self._run = run
        self._offline = offline
        self.id = run_id
        self.url = url

    def _log_params(self, params: dict[str, Any]) -> None:
        self._run.log_configs({PARAMS_NAMESPACE + key: value for key, value in params.items()})

    def _log_metrics(self, step: int, values: dict[str, float]) -> None:
        self._run.log_metrics(values, step=step)

    def _set_tags(self, tags: dict[str, str]) -> None:
        self._run.log_configs({TAGS_NAMESPACE + key: value for key, value in tags.items()})

    def _finish(self, status: Status) -> None:
        self._run.log_configs({STATUS_ATTRIBUTE: status})
        # Offline, closing always warns that the data is not synced yet: that is the point of offline.
        with _neptune_log_level(logging.ERROR) if self._offline else contextlib.nullcontext():
            self._run.close()


def open_neptune_run(
    config: TrackingConfig, root: Path, *, name: str, run_key: str, api_token: str | None
) -> NeptuneRun:
    """Open the Neptune run `run_key` (continuing it if it exists): online with a token, else offline."""
    assert config.project is not None, "TrackingConfig requires a project for the neptune backend"
    log_directory = (root / STORE_DIR / run_key).resolve()
    offline = api_token is None
    run = Run(
        project=config.project,
        api_token=api_token,
        run_id=run_key,
        mode="offline" if offline else "async",
        log_directory=log_directory,
        enable_console_log_capture=False,  # the stage's own log already goes to Dagster
        source_tracking_config=None,  # provenance is the registry's job
    )
    if offline:
        url = str(log_directory)
    else:
        try:
            url = run.get_run_url()
        except ValueError as e:
            run.terminate()
            raise ConfigError(
                f"NEPTUNE_API_TOKEN is not a Neptune API token ({e}): copy it again from your Neptune server"
            ) from e
    run.log_configs({NAME_ATTRIBUTE: name})
    return NeptuneRun(run, run_id=run_key, url=url, offline=offline)


@contextlib.contextmanager
def _neptune_log_level(level: int) -> Iterator[None]:
    logger = logging.getLogger("neptune")
    previous = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(previous)
