"""Stage processes: `python -m factory.runtime <request.json>` runs one stage and publishes its artifact.

Each stage kind (`factory.config.kinds`) says where its code is; a process imports only its own
stage's (a data stage never loads torch). `warm_modules` is what a warm interpreter imports once
for the stages it forks (`factory.launch.warm`): the runners of the kinds a run computes and the
code they load on first use (benchmarks, the tracker); `every_warm_module()`, for every kind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from factory.config.kinds import registered_kinds, stage_kind
from factory.track.base import OPENERS

if TYPE_CHECKING:
    from factory.runtime.context import StageContext

EVALUATION_MODULES = ("factory.stages.scoring", "factory.evals.suite", "factory.evals.bpb", "factory.evals.next_line",
                      "factory.evals.code_exec", "factory.evals.sanity")
"""What an `evaluation` stage imports when it runs: its scoring and the benchmarks it loads on first use."""
TRACKER_MODULES = {backend: opener.split(":")[0] for backend, opener in OPENERS.items()}
"""Each tracking backend's module, which a training stage imports on first use."""


def warm_modules(kinds: Iterable[str], tracker: str) -> tuple[str, ...]:
    """What a warm interpreter imports for a run that computes these stage kinds, tracked by this backend: their
    runners, in the order the kinds come, and when one of them makes checkpoints, the tracker's backend and the
    evaluations."""
    declared = [stage_kind(kind) for kind in kinds]
    runners = [kind.run.split(":")[0] if isinstance(kind.run, str) else kind.run.__module__ for kind in declared]
    training = [*([TRACKER_MODULES[tracker]] if tracker in TRACKER_MODULES else []), *EVALUATION_MODULES]
    checkpoints = any(kind.checkpoints for kind in declared)
    return tuple(dict.fromkeys(["factory.runtime.__main__", *runners, *(training if checkpoints else [])]))


def every_warm_module() -> tuple[str, ...]:
    """Everything a warm interpreter may fork: every kind's runner, the evaluations, the default tracker."""
    return warm_modules([kind.name for kind in registered_kinds()], "mlflow")


def runner(kind: str) -> Callable[[StageContext], dict[str, Any]]:
    """The run function of a stage kind, imported now."""
    return stage_kind(kind).run_function()
