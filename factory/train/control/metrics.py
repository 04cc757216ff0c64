"""Metric kinds: what the training loop keeps for rules to read, registered by name.

A metric turns the loop's observations into plain values (`name.field` in a condition:
numbers, and lists of numbers for windows). Its state goes into every checkpoint, so a resumed
run decides exactly as an uninterrupted one would.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from factory.config.control import MetricSpec
from factory.train.control.typecheck import Number, Window


@dataclass(frozen=True, kw_only=True, slots=True)
class Observation:
    """What the loop saw at an event (fields that do not apply to the event are None)."""

    event: str
    step: int
    """Steps done (at step_end: including the step whose update is pending)."""
    loss: float | None = None
    grad_norm: float | None = None
    lr: float | None = None
    tokens_per_second: float | None = None
    sample_losses: tuple[float, ...] = ()
    """Mean token loss of every sequence of the global batch."""
    eval_loss: float | None = None


class Metric:
    """Base of a metric kind: `observe` before the rules run, `commit` after them, plain `values` between."""

    FIELDS: ClassVar[dict[str, str]] = {}
    """Field name -> what it holds (`window` fields are lists of numbers)."""
    WINDOWS: ClassVar[frozenset[str]] = frozenset()
    NEEDS_SAMPLES: ClassVar[bool] = False
    """Whether the loop must compute per-sequence losses for it (they cost a little per step)."""

    def __init__(self, spec: MetricSpec) -> None:
        self.spec = spec

    def observe(self, observation: Observation) -> None:
        """Take in what the loop saw."""

    def commit(self, observation: Observation, accepted: bool) -> None:
        """After the rules ran: `accepted` is False when the step's update was skipped or rewound."""

    def values(self) -> dict[str, Any]:
        """The fields, as plain numbers and lists."""
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        """Everything needed to continue exactly (saved in checkpoints)."""
        raise NotImplementedError

    def load(self, state: dict[str, Any]) -> None:
        """Inverse of `state`."""
        raise NotImplementedError

    @classmethod
    def types(cls, spec: MetricSpec) -> dict[str, Number | Window]:
        """The type of each field, for `factory check` to prove a condition gives true or false (default: numbers of any
        size, windows of up to `spec.window` of them)."""
        return {name: Window(spec.window) if name in cls.WINDOWS else Number() for name in cls.FIELDS}


METRIC_KINDS: dict[str, type[Metric]] = {}


def metric_kind(name: str) -> Callable[[type[Metric]], type[Metric]]:
    """Register a metric kind under `name` (the `kind:` of a control metric)."""

    def register(cls: type[Metric]) -> type[Metric]:
        METRIC_KINDS[name] = cls
        return cls

    return register


@metric_kind("history")
class History(Metric):
    """Sliding windows of training values (every step) and eval losses (every eval)."""

    FIELDS: ClassVar[dict[str, str]] = {
        "loss": "training loss of the last `window` steps",
        "grad_norm": "gradient norm before clipping, last `window` steps",
        "lr": "learning rate, last `window` steps",
        "tokens_per_second": "throughput, last `window` steps",
        "eval_loss": "validation loss of the last `window` evaluations",
        "best_eval_loss": "lowest validation loss so far (nan before the first evaluation)",
        "evals_since_best": "evaluations since the lowest validation loss (0: the last one was the best)",
    }
    WINDOWS: ClassVar[frozenset[str]] = frozenset({"loss", "grad_norm", "lr", "tokens_per_second", "eval_loss"})
    TRAINING = ("loss", "grad_norm", "lr", "tokens_per_second")

    def __init__(self, spec: MetricSpec) -> None:
        super().__init__(spec)
        self.windows: dict[str, deque[float]] = {name: deque(maxlen=spec.window) for name in self.FIELDS if name in self.WINDOWS}
        self.best, self.since_best = math.nan, 0

    def observe(self, observation: Observation) -> None:
        if observation.event == "step_end":
            for name in self.TRAINING:
                value = getattr(observation, name)
                if value is not None:
                    self.windows[name].append(float(value))
        elif observation.event == "eval" and observation.eval_loss is not None:
            self.windows["eval_loss"].append(observation.eval_loss)
            if math.isnan(self.best) or observation.eval_loss < self.best:
                self.best, self.since_best = observation.eval_loss, 0
            else:
                self.since_best += 1

    def values(self) -> dict[str, Any]:
        return {**{name: list(window) for name, window in self.windows.items()}, "best_eval_loss": self.best, "evals_since_best": self.since_best}

    def state(self) -> dict[str, Any]:
        # Throughput is wall-clock: saving it would make two runs of the same recipe write different checkpoint bytes.
        windows = {name: list(window) for name, window in self.windows.items() if name != "tokens_per_second"}
        return {"windows": windows, "best": self.best, "since_best": self.since_best}

    def load(self, state: dict[str, Any]) -> None:
        for name, values in state["windows"].items():
            self.windows[name] = deque(values, maxlen=self.spec.window)
        self.best, self.since_best = state["best"], state["since_best"]


@metric_kind("batch_inspector")
class BatchInspector(Metric):
    """The batch just computed against running statistics of the accepted batches before it."""

    FIELDS: ClassVar[dict[str, str]] = {
        "loss": "this batch's loss",
        "mean_loss": "mean loss of the last `window` accepted batches (nan before the first)",
        "std_loss": "their standard deviation (nan before the first)",
        "count": "how many batches the statistics cover",
        "max_sample_loss": "the highest mean token loss of one sequence in this batch",
        "sample_losses": "mean token loss of every sequence in this batch",
    }
    WINDOWS: ClassVar[frozenset[str]] = frozenset({"sample_losses"})
    NEEDS_SAMPLES: ClassVar[bool] = True

    @classmethod
    def types(cls, spec: MetricSpec) -> dict[str, Number | Window]:
        return {**super().types(spec), "count": Number(spec.window), "sample_losses": Window(math.inf)}  # one loss per sequence

    def __init__(self, spec: MetricSpec) -> None:
        super().__init__(spec)
        self.accepted: deque[float] = deque(maxlen=spec.window)
        self.current = Observation(event="step_end", step=0)

    def observe(self, observation: Observation) -> None:
        if observation.event == "step_end":
            self.current = observation

    def commit(self, observation: Observation, accepted: bool) -> None:
        if observation.event == "step_end" and accepted and observation.loss is not None and math.isfinite(observation.loss):
            self.accepted.append(observation.loss)

    def values(self) -> dict[str, Any]:
        window = list(self.accepted)
        mean = sum(window) / len(window) if window else math.nan
        std = math.sqrt(sum((v - mean) * (v - mean) for v in window) / len(window)) if window else math.nan  # '**' raises on overflow
        samples = list(self.current.sample_losses)
        return {
            "loss": self.current.loss if self.current.loss is not None else math.nan,
            "mean_loss": mean, "std_loss": std, "count": len(window),
            "max_sample_loss": max(samples) if samples else math.nan, "sample_losses": samples,
        }

    def state(self) -> dict[str, Any]:
        return {"accepted": list(self.accepted)}

    def load(self, state: dict[str, Any]) -> None:
        self.accepted = deque(state["accepted"], maxlen=self.spec.window)


@dataclass(kw_only=True, slots=True)
class Metrics:
    """The declared metrics of one run, by name."""

    by_name: dict[str, Metric] = field(default_factory=dict)

    def observe(self, observation: Observation) -> None:
        for metric in self.by_name.values():
            metric.observe(observation)

    def commit(self, observation: Observation, accepted: bool) -> None:
        for metric in self.by_name.values():
            metric.commit(observation, accepted)

    def values(self) -> dict[str, dict[str, Any]]:
        return {name: metric.values() for name, metric in self.by_name.items()}

    def wants_samples(self) -> bool:
        """Whether any metric reads per-sequence losses."""
        return any(metric.NEEDS_SAMPLES for metric in self.by_name.values())
