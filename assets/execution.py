"""What in-process runs share: every asset, the embedded-default resources, the console log level, failures said plainly."""

from pathlib import Path

from dagster import DagsterEventType, ExecuteInProcessResult

from assets.checkpoints import checkpoints
from assets.evaluations import evaluations
from assets.heldout import heldout_corpus
from assets.leaderboard import NO_REGRESSION, best_model, leaderboard
from assets.post import code_exec_tasks
from assets.report import run_report
from assets.stages import stage_assets
from resources import ExperimentFiles, FactoryStores, launcher_from_env

# Dagster's step-by-step DEBUG events drown the stage logs on a terminal; the UI keeps them all.
RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}
EVERYTHING = [*stage_assets, checkpoints, evaluations, leaderboard, best_model, run_report, code_exec_tasks, heldout_corpus]


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
            error = event.step_failure_data.user_failure_data
            description = error.description if error is not None and error.description else None
            messages.append(f"{event.step_key}: {description or event.step_failure_data.error.message.strip()}")
    return messages



def gate_refused(result: ExecuteInProcessResult) -> bool:
    """Whether the run failed only because the leaderboard's no-regression check held the best model back."""
    failed_checks = [e.event_specific_data for e in result.all_events
                     if e.event_type == DagsterEventType.ASSET_CHECK_EVALUATION and not e.event_specific_data.passed]
    failed_steps = [e.step_key for e in result.all_events if e.is_step_failure]
    return bool(failed_checks) and all(c.check_name == NO_REGRESSION for c in failed_checks) and set(failed_steps) <= {"leaderboard"}
