"""Operations a rule runs, registered by name; each sets what the loop does next and says what it did.

An operation never touches the model itself: it marks `Actions` (checkpoint, stop, evaluate,
skip the batch, rewind, scale the learning rate) that the loop carries out after the event, so
the order of a composite `do:` list is the order the loop follows. `log`, `log_batch` and
`alert` only add to the record of the action.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

TEMPLATE_FIELD = re.compile(r"\{([a-z_][a-z0-9_]*)(?:\.([a-z][a-z0-9_]*))?\}")
MAX_MESSAGE = 300
MAX_LR_FACTOR = 10.0


@dataclass(kw_only=True, slots=True)
class Actions:
    """What the rules that fired at one event ask of the loop."""

    checkpoint: bool = False
    stop: bool = False
    evaluate: bool = False
    skip_batch: bool = False
    rewind: bool = False
    lr_factor: float = 1.0
    records: list[dict[str, Any]] = field(default_factory=list)
    """One record per rule that acted: step, event, rule, operations, and messages / batch / alert."""

    @property
    def drops_update(self) -> bool:
        """The step's update must not be applied."""
        return self.skip_batch or self.rewind


@dataclass(frozen=True, kw_only=True, slots=True)
class Operation:
    """A registered operation: what it does, the events it makes sense at, the argument it takes."""

    name: str
    apply: Callable[[Actions, dict[str, Any], Any, Mapping[str, Any]], None]
    """(actions, this rule's record, argument, values the condition saw) -> None."""
    events: tuple[str, ...] | None = None
    """Events where it may be used (None: any)."""
    argument: Callable[[Any], str | None] | None = None
    """Checks the argument: None when fine, else what is wrong. Absent: the operation takes none."""


OPERATIONS: dict[str, Operation] = {}


def register(operation: Operation) -> Operation:
    """Register an operation under its name (what `do:` lists)."""
    OPERATIONS[operation.name] = operation
    return operation


def render(template: str, values: Mapping[str, Any]) -> str:
    """Fill `{step}` and `{metric.field}` from the values; nothing else is interpreted (no format specs, no attributes)."""

    def field_value(match: re.Match[str]) -> str:
        owner, name = match.group(1), match.group(2)
        value = values.get(owner)
        if name is not None:
            value = value.get(name) if isinstance(value, dict) else None
        if isinstance(value, float):
            return f"{value:.6g}"
        if isinstance(value, list):
            return "[" + ", ".join(f"{v:.4g}" for v in value[-5:]) + "]"
        return str(value) if value is not None else match.group(0)

    return TEMPLATE_FIELD.sub(field_value, template)[:MAX_MESSAGE]


def _message(value: Any) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return f"expected a message text (it may name {{step}} and {{metric.field}}), found {value!r}"
    if len(value) > MAX_MESSAGE:
        return f"the message is {len(value)} characters; the limit is {MAX_MESSAGE}"
    return None


def _factor(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or not 0 < value <= MAX_LR_FACTOR:
        return f"expected a factor above 0 and at most {MAX_LR_FACTOR:g}, found {value!r}"
    return None


def _set(flag: str) -> Callable[[Actions, dict[str, Any], Any, Mapping[str, Any]], None]:
    def apply(actions: Actions, record: dict[str, Any], argument: Any, values: Mapping[str, Any]) -> None:
        setattr(actions, flag, True)

    return apply


def _log(actions: Actions, record: dict[str, Any], argument: Any, values: Mapping[str, Any]) -> None:
    record.setdefault("messages", []).append(render(argument, values))


def _alert(actions: Actions, record: dict[str, Any], argument: Any, values: Mapping[str, Any]) -> None:
    record["alert"] = render(argument, values)


def _log_batch(actions: Actions, record: dict[str, Any], argument: Any, values: Mapping[str, Any]) -> None:
    record["batch"] = True  # the loop fills in the documents and per-sequence losses it holds


def _scale_lr(actions: Actions, record: dict[str, Any], argument: Any, values: Mapping[str, Any]) -> None:
    actions.lr_factor *= float(argument)


for _operation in (
    Operation(name="checkpoint", apply=_set("checkpoint")),
    Operation(name="stop", apply=_set("stop")),
    Operation(name="evaluate", apply=_set("evaluate"), events=("step_end", "checkpoint", "train_end")),
    Operation(name="skip_batch", apply=_set("skip_batch"), events=("step_end",)),
    Operation(name="rewind", apply=_set("rewind"), events=("step_end", "eval")),
    Operation(name="scale_lr", apply=_scale_lr, argument=_factor),
    Operation(name="log", apply=_log, argument=_message),
    Operation(name="log_batch", apply=_log_batch, events=("step_end",)),
    Operation(name="alert", apply=_alert, argument=_message),
):
    register(_operation)
