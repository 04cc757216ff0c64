"""Stage processes: `python -m factory.stages <request.json>` runs one stage and publishes its artifact.

`RUNNERS` says where each stage kind's code is; a process imports only its own stage's (a data
stage never loads torch). `WARM_MODULES` is what a warm interpreter imports once for all the
stages it forks (`factory.launch.warm`): every runner, the evaluation process and the code they
load on first use (benchmarks, the tracker).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

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
WARM_MODULES = (
    "factory.stages.__main__",
    *dict.fromkeys(target.split(":")[0] for target in RUNNERS.values()),
    EVALUATE_MODULE,
    "factory.evals.suite",
    "factory.evals.bpb",
    "factory.evals.next_line",
    "factory.evals.code_exec",
    "factory.evals.sanity",
    "factory.track.mlflow_backend",
)


def runner(kind: str) -> Callable[[StageContext], dict[str, Any]]:
    """The run function of a stage kind, imported now."""
    module, name = RUNNERS[kind].split(":")
    return getattr(importlib.import_module(module), name)
