"""Stage processes: `python -m factory.stages <request.json>` runs one stage and publishes its artifact.

`RUNNERS` says where each stage kind's code is; a process imports only its own stage's (a data
stage never loads torch). `warm_modules` is what a warm interpreter imports once for the stages
it forks (`factory.launch.warm`): the runners of the kinds a run computes and the code they load
on first use (benchmarks, the tracker); `WARM_MODULES`, for every kind.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from factory.config.stages import TRAINING_STAGES  # they open a tracker run and publish checkpoints, evaluated next
from factory.track.base import OPENERS

if TYPE_CHECKING:
    from factory.stages.context import StageContext

RUNNERS = {
    "raw_datasets": "factory.stages.datasets:run_raw_datasets",
    "deduped_datasets": "factory.stages.datasets:run_deduped_datasets",
    "filtered_datasets": "factory.stages.datasets:run_filtered_datasets",
    "blend": "factory.stages.datasets:run_blend",
    "tokenizer": "factory.stages.runners:run_tokenizer",
    "pretrain": "factory.stages.runners:run_pretrain",
    "sft": "factory.stages.post:run_sft",
    "rl": "factory.stages.post:run_rl",
    "model": "factory.stages.runners:run_model",
}
"""Each stage kind's run function, as `module:function`."""
EVALUATE_MODULE = "factory.stages.evaluate"
"""The evaluation process: `python -m factory.stages.evaluate <request.json>`."""
EVALUATION_MODULES = (EVALUATE_MODULE, "factory.evals.suite", "factory.evals.bpb", "factory.evals.next_line",
                      "factory.evals.code_exec", "factory.evals.sanity")
"""The evaluation process and the benchmarks it loads on first use."""
TRACKER_MODULES = {backend: opener.split(":")[0] for backend, opener in OPENERS.items()}
"""Each tracking backend's module, which a training stage imports on first use."""


def warm_modules(kinds: Iterable[str], tracker: str) -> tuple[str, ...]:
    """What a warm interpreter imports for a run that computes these stage kinds, tracked by this backend: their
    runners, in the order the kinds come, and when one of them trains, the tracker's backend and the evaluations."""
    kinds = list(kinds)
    runners = [RUNNERS[kind].split(":")[0] for kind in kinds if kind in RUNNERS]
    training = [*([TRACKER_MODULES[tracker]] if tracker in TRACKER_MODULES else []), *EVALUATION_MODULES]
    return tuple(dict.fromkeys(["factory.stages.__main__", *runners, *(training if set(kinds) & set(TRAINING_STAGES) else [])]))


WARM_MODULES = warm_modules(RUNNERS, "mlflow")
"""Everything a warm interpreter may fork: every runner, the evaluations, the default tracker."""


def runner(kind: str) -> Callable[[StageContext], dict[str, Any]]:
    """The run function of a stage kind, imported now."""
    module, name = RUNNERS[kind].split(":")
    return getattr(importlib.import_module(module), name)
