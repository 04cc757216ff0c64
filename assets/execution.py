"""What in-process runs share: every asset, the embedded-default resources, the console logger, failures said plainly."""

import logging
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dagster import DagsterEventType, Definitions, ExecuteInProcessResult, Field, InitLoggerContext, define_asset_job, logger

from assets.checkpoints import checkpoints
from assets.evaluations import evaluations
from assets.benchmark_data import heldout_corpus, humaneval_problems
from assets.leaderboard import NO_REGRESSION, best_model, leaderboard
from assets.post import code_exec_tasks
from assets.report import run_report
from assets.stages import stage_assets
from assets.watch import cancel, process_tags, watching
from resources import ExperimentFiles, FactoryStores, launcher_from_env

# Dagster's step-by-step DEBUG events drown the stage logs on a terminal; the UI keeps them all.
RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}
EVERYTHING = [*stage_assets, checkpoints, evaluations, leaderboard, best_model, run_report, code_exec_tasks, heldout_corpus, humaneval_problems]
JOB = "__ephemeral_asset_job__"
"""The name `dagster.materialize` gives its job: the UI shows such runs as plain materializations."""
LOG_FORMAT = "%(asctime)s - %(name)s - %(levelname)s - %(message)s"
INTERRUPTS = ("DagsterExecutionInterruptedError", "KeyboardInterrupt")
"""The errors of a step or run that someone stopped (Ctrl-C, SIGTERM), rather than one that failed."""


def logged_to(path: Path) -> dict:
    """RUN_CONFIG, with everything the runs log (the stack traces of their failures too) also appended to `path`."""
    return {"loggers": {"console": {"config": {**RUN_CONFIG["loggers"]["console"]["config"], "log_file": str(path)}}}}


@logger(
    config_schema={"log_level": Field(str, default_value="INFO"), "log_file": Field(str, default_value="")},
    description="The terminal: what the run says, but its errors, which the run's summary says once; the log file: all of it.",
)
def console(init_context: InitLoggerContext) -> logging.Logger:
    """Dagster's console logger, but ERROR records (a failure's stack trace, the steps it skipped) only in the log file."""
    config = init_context.logger_config
    log = logging.Logger("dagster", config["log_level"])  # not registered: one per run, as Dagster's own console logger
    terminal = logging.StreamHandler(sys.stderr)
    terminal.setFormatter(logging.Formatter(LOG_FORMAT))
    terminal.addFilter(lambda record: record.levelno < logging.ERROR)
    log.addHandler(terminal)
    if config["log_file"]:
        file = logging.FileHandler(config["log_file"], mode="a", encoding="utf-8", delay=True)
        file.setFormatter(logging.Formatter(LOG_FORMAT))
        log.addHandler(file)
    return log


def materialize(assets: Sequence[Any], *, selection: Sequence[str] | None = None, resources: dict | None = None,
                tags: dict[str, str] | None = None, **options: Any) -> ExecuteInProcessResult:
    """`dagster.materialize` with the factory's `console` logger: one job over `assets`, run in this process, tagged with
    the process (so that a later run can tell it died) and watched while it goes (`assets.watch`); a run someone stopped
    ends CANCELED, holding no slot of any pool."""
    defs = Definitions(assets=assets, jobs=[define_asset_job(JOB, selection=selection)], resources=resources or {},
                       loggers={"console": console})
    run_id = str(uuid.uuid4())  # known before the run starts, so that the watch can follow it
    with watching(run_id):
        result = defs.resolve_job_def(JOB).execute_in_process(run_id=run_id, tags={**process_tags(), **(tags or {})}, **options)
    if interrupted(result) and options.get("instance") is not None:
        cancel(options["instance"], run_id, "interrupted: " + "; ".join(failure_messages(result)))
    return result


def resources_at(root: Path, experiments: Path = Path("experiments")) -> dict:
    """The resources over the stores under `root`: the local launcher, or the volcano one when $FACTORY_CLUSTER says so."""
    return {"experiments": ExperimentFiles(directory=str(experiments)), "stores": FactoryStores(root=str(root)), "launcher": launcher_from_env()}


def failure_messages(result: ExecuteInProcessResult) -> list[str]:
    """What went wrong, one message per failed step or check, without Dagster's stack traces."""
    messages = []
    for event in result.all_events:
        if event.event_type == DagsterEventType.ASSET_CHECK_EVALUATION and not event.event_specific_data.passed:
            check = event.event_specific_data
            messages.append(f"{check.asset_key.to_user_string()} check {check.check_name} failed: {check.description}")
        if event.is_step_failure and event.step_failure_data is not None:
            user = event.step_failure_data.user_failure_data
            error = event.step_failure_data.error
            if user is not None and user.description:
                said = user.description
            elif error.cls_name in INTERRUPTS:  # the launcher notes what the stage said as it stopped
                said = "".join(error.message.splitlines(keepends=True)[1:]).strip() or "interrupted"
            else:
                said = error.message.strip()
            messages.append(said if said.startswith(f"{event.step_key}: ") else f"{event.step_key}: {said}")
    return messages


def interrupted(result: ExecuteInProcessResult) -> bool:
    """Whether someone stopped the run (Ctrl-C, SIGTERM), rather than a step failing."""
    for event in result.all_events:
        if event.is_step_failure and event.step_failure_data is not None:
            error = event.step_failure_data.error
        elif event.event_type == DagsterEventType.RUN_FAILURE:
            error = getattr(event.event_specific_data, "error", None)
        else:
            continue
        if error is not None and error.cls_name in INTERRUPTS:
            return True
    return False


def gate_refused(result: ExecuteInProcessResult) -> bool:
    """Whether the run failed only because the leaderboard's no-regression check held the best model back."""
    failed_checks = [e.event_specific_data for e in result.all_events
                     if e.event_type == DagsterEventType.ASSET_CHECK_EVALUATION and not e.event_specific_data.passed]
    failed_steps = [e.step_key for e in result.all_events if e.is_step_failure]
    return bool(failed_checks) and all(c.check_name == NO_REGRESSION for c in failed_checks) and set(failed_steps) <= {"leaderboard"}
