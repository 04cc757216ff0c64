"""The `control:` section: metrics the training loop keeps and rules that act on them.

This module holds only the shape of the section. What a metric kind computes, what an
operation does and whether a condition is safe and well-typed are decided by
`factory.train.control`, which `factory check` consults (with file:line) before any training.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from factory.config.section import Section

EVENTS = ("step_end", "eval", "checkpoint", "train_end")
Event = Literal["step_end", "eval", "checkpoint", "train_end"]
IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")
RESERVED_NAMES = ("step", "steps")


class MetricSpec(Section):
    """One metric the rules can read, by name: `<name>.<field>` in a condition."""

    name: str
    """How conditions refer to it (lower_snake_case; not `step` or `steps`)."""
    kind: str
    """A registered metric kind: `history` (sliding windows of training and eval values) or `batch_inspector`."""
    window: int = Field(20, ge=1, le=10_000)
    """How many recent values the metric keeps."""

    @field_validator("name")
    @classmethod
    def _name_is_identifier(cls, value: str) -> str:
        if not IDENTIFIER.fullmatch(value) or value in RESERVED_NAMES:
            raise ValueError(f"expected a lower_snake_case name other than {', '.join(RESERVED_NAMES)}, found {value!r}")
        return value


class PatienceSpec(Section):
    """How often a condition must hold before the rule acts."""

    threshold: int = Field(1, ge=1, le=1_000_000)
    """The rule acts when the condition has held this many times."""
    mode: Literal["reset_on_false", "cumulative"] = "reset_on_false"
    """`reset_on_false`: that many times in a row; `cumulative`: that many times in all. The count restarts after the rule acts."""


class RuleSpec(Section):
    """When `when` holds (with patience) at one of the `on` events, run the operations of `do` in order."""

    name: str
    """Named in every record of what the rule did."""
    on: tuple[Event, ...] = ("step_end",)
    """Events the rule is evaluated at: step_end (before the optimizer step), eval, checkpoint, train_end."""
    when: str
    """A condition over the metrics (e.g. `batch.loss > 3 * batch.mean_loss`); `factory check` proves it true or false on every branch."""
    patience: PatienceSpec = PatienceSpec()
    do: tuple[str | dict[str, Any], ...] = Field(min_length=1)
    """Operations, in order: a name (`stop`), or a one-key mapping of name to argument (`{scale_lr: 0.5}`)."""
    max_times: int | None = Field(None, ge=1, le=1_000_000_000)
    """The rule acts at most this many times in a run (null: no limit)."""

    @field_validator("name")
    @classmethod
    def _name_is_identifier(cls, value: str) -> str:
        if not IDENTIFIER.fullmatch(value):
            raise ValueError(f"expected a lower_snake_case name, found {value!r}")
        return value

    @field_validator("on")
    @classmethod
    def _some_event(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError(f"name at least one event: {', '.join(EVENTS)}")
        return value

    @field_validator("do")
    @classmethod
    def _operations_are_named(cls, value: tuple[str | dict[str, Any], ...]) -> tuple[str | dict[str, Any], ...]:
        for item in value:
            if isinstance(item, dict) and len(item) != 1:
                raise ValueError(f"an operation with an argument is a one-key mapping like {{scale_lr: 0.5}}, found {item!r}")
        return value

    def operations(self) -> tuple[tuple[str, Any], ...]:
        """(name, argument or None) for every entry of `do`."""
        return tuple((item, None) if isinstance(item, str) else next(iter(item.items())) for item in self.do)


class ControlConfig(Section):
    """Training control as code: rules evaluated inside the training loop."""

    eval_every: int = Field(0, ge=0, le=1_000_000_000)
    """Measure the validation loss every N steps (an `eval` event); 0: only when an `evaluate` operation asks."""
    eval_batches: int = Field(4, ge=1, le=1000)
    """Validation batches (of pretrain.batch_size sequences) each in-loop evaluation scores."""
    metrics: tuple[MetricSpec, ...] = ()
    rules: tuple[RuleSpec, ...] = ()
    budget_ms: float = Field(50.0, gt=0, le=10_000)
    """Time allowed to evaluate one condition; a condition that takes longer counts as false there (an alert records it once per rule)."""

    @model_validator(mode="after")
    def _names_are_unique(self) -> ControlConfig:
        for what, names in (("metric", [m.name for m in self.metrics]), ("rule", [r.name for r in self.rules])):
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ValueError(f"{what} names must be unique; given more than once: {', '.join(twice)}")
        return self
