"""Stage processes: `python -m factory.runtime <request.json>` runs one stage and publishes its artifact.

Each stage kind (`factory.config.kinds`) says where its code is; a process imports only its own
stage's (a data stage never loads torch). `warm_modules` is what a warm interpreter imports once
for the stages it forks (`factory.launch.warm`): the modules of the kinds a run computes, what
their run functions import (each kind's `imports`) and the code they load on first use
(benchmarks, the tracker); `every_warm_module()`, for every kind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from factory.config.kinds import StageKind, registered_kinds, stage_kind
from factory.data.catalog import OPENED_MODULES
from factory.errors import ConfigError
from factory.track.base import OPENERS, TrackingConfig

if TYPE_CHECKING:
    from factory.runtime.context import StageContext

TRACKER_MODULES = {backend: opener.split(":")[0] for backend, opener in OPENERS.items()}
"""Each tracking backend's module, which a training stage imports on first use."""
OPTIMIZER_MODULES = ("torch._dynamo",)
"""What torch imports when a process builds its first optimizer (torch.optim wraps its methods with dynamo's `disable`):
about half a CPU-second of every training stage forked from a warm interpreter that had not imported it."""


def warm_modules(kinds: Iterable[str], tracker: str) -> tuple[str, ...]:
    """What a warm interpreter imports for a run that computes these stage kinds, tracked by this backend: each kind's
    run function's module and what it imports when it runs, in the order the kinds come, after what opening the catalog
    imports (every kind but the export reads or writes tables); and when one of them makes checkpoints (trains), the
    tracker's backend, what building an optimizer imports and the evaluations."""
    declared = [stage_kind(kind) for kind in kinds]
    runners = [module for kind in declared for module in _modules(kind)]
    scoring = [module for kind in registered_kinds() if kind.scope == "checkpoints" for module in _modules(kind)]
    training = [*([TRACKER_MODULES[tracker]] if tracker in TRACKER_MODULES else []), *OPTIMIZER_MODULES, *scoring]
    checkpoints = any(kind.checkpoints for kind in declared)
    return tuple(dict.fromkeys(["factory.runtime.__main__", *OPENED_MODULES, *runners, *(training if checkpoints else [])]))


def warm_order(kinds: Sequence[str], tracker: str) -> tuple[tuple[str, ...], int]:
    """`warm_modules(kinds, tracker)` with those the first kind needs (the run's first stage) first, and how many those are."""
    first = warm_modules(kinds[:1], tracker)
    return tuple(dict.fromkeys([*first, *warm_modules(kinds, tracker)])), len(first)


def tracker_backend(environ: Mapping[str, str]) -> str:
    """The tracker the stages will open (a bad setting: none here; the stage that opens it says what to change)."""
    try:
        return TrackingConfig.from_env(environ).backend
    except ConfigError:
        return "none"


def _modules(kind: StageKind) -> tuple[str, ...]:
    """The module of a kind's run function, then what that function imports when it runs."""
    return (_run_module(kind), *kind.imports)


def _run_module(kind: StageKind) -> str:
    """The module of a kind's run function."""
    return kind.run.split(":")[0] if isinstance(kind.run, str) else kind.run.__module__


def every_warm_module(tracker: str = "mlflow") -> tuple[str, ...]:
    """Everything a warm interpreter may fork: every kind's run function and what it imports, the evaluations, the
    tracker's backend (default: the default tracker's)."""
    return warm_modules([kind.name for kind in registered_kinds()], tracker)


def runner(kind: str) -> Callable[[StageContext], dict[str, Any]]:
    """The run function of a stage kind, imported now."""
    return stage_kind(kind).run_function()
