"""The controller: the rules of a `control:` section, evaluated at the loop's events, with patience.

`problems` is everything `factory check` can know wrong about a section (unknown metric kinds,
fields and operations, unsafe conditions, conditions that are not true/false on every branch or
can outgrow their bounds (`typecheck`), operations at events where they mean nothing), each with
the dotted field it belongs to. A `Controller` is built only from a section without problems;
its state (metrics, patience counts, learning rate factor, records so far) is saved in every
checkpoint. A rule never fails a run: a condition that cannot be evaluated at run time (its time
budget ran out) counts as false at that event, and its first failure is recorded as an alert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from factory.config.control import ControlConfig, RuleSpec
from factory.errors import ConfigError
from factory.train.control.expression import Condition, ConditionError, evaluate, parse_condition
from factory.train.control.metrics import METRIC_KINDS, Metrics, Observation
from factory.train.control.typecheck import check_types
from factory.train.control.operations import OPERATIONS, Actions

Problem = tuple[tuple[str | int, ...], str]
"""(key path inside the experiment, what is wrong)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """A rule with its condition parsed."""

    spec: RuleSpec
    condition: Condition


MAX_STEPS = 10**9
"""What `step` may reach when the planned steps are not known."""


def problems(config: ControlConfig, steps: int | None = None) -> list[Problem]:
    """Everything wrong with a control section, by key path, for a run of `steps` steps; empty when a Controller can be
    built from it."""
    found: list[Problem] = []
    schema: dict[str, Any] = {}
    kinds = {}
    for i, metric in enumerate(config.metrics):
        kind = METRIC_KINDS.get(metric.kind)
        if kind is None:
            found.append((("control", "metrics", i, "kind"), f"unknown metric kind {metric.kind!r}; registered: {', '.join(sorted(METRIC_KINDS))}"))
            continue
        kinds[metric.name] = kind
        schema[metric.name] = kind.types(metric)
    for i, rule in enumerate(config.rules):
        at = ("control", "rules", i)
        found += [((*at, "when"), message) for message in _condition_problems(rule, config, kinds, schema, steps or MAX_STEPS)]
        for j, (name, argument) in enumerate(rule.operations()):
            operation = OPERATIONS.get(name)
            where = (*at, "do", j)
            if operation is None:
                found.append((where, f"unknown operation {name!r}; registered: {', '.join(sorted(OPERATIONS))}"))
                continue
            if operation.argument is None and argument is not None:
                found.append((where, f"{name} takes no argument; write it as a plain word"))
            elif operation.argument is not None and (why := operation.argument(argument)):
                found.append((where, f"{name}: {why}"))
            misplaced = [event for event in rule.on if operation.events is not None and event not in operation.events]
            if misplaced:
                found.append((where, f"{name} cannot run at {', '.join(misplaced)}; it can at {', '.join(operation.events or ())}"))
    return found


def _condition_problems(rule: RuleSpec, config: ControlConfig, kinds: dict[str, type], schema: dict[str, Any], steps: int) -> list[str]:
    """What is wrong with a rule's condition: unsafe or malformed, unknown fields, not true/false on every branch, unbounded."""
    try:
        condition = parse_condition(rule.when, {m.name: m for m in config.metrics})
    except ConditionError as e:
        return [f"{e} (found {rule.when!r})"]
    unknown = [(owner, name) for owner, name in sorted(condition.fields) if owner in kinds and name not in kinds[owner].FIELDS]
    if unknown:
        return [f"{owner}.{name} is not a field of a {kinds[owner].__name__} metric; fields: {', '.join(kinds[owner].FIELDS)}" for owner, name in unknown]
    if any(owner not in kinds for owner, _ in condition.fields):
        return []  # its metric's kind is unknown, which is reported on the metric
    try:
        check_types(condition.tree, schema, steps)
    except ConditionError as e:
        return [f"{e} (found {rule.when!r})"]
    return []


class Controller:
    """Evaluates the rules at each event and says what the loop must do."""

    def __init__(self, config: ControlConfig, steps: int) -> None:
        found = problems(config, steps)
        if found:
            raise ConfigError("; ".join(f"{'.'.join(str(k) for k in keys)}: {message}" for keys, message in found))
        self.config = config
        self.steps = steps
        self.metrics = Metrics(by_name={m.name: METRIC_KINDS[m.kind](m) for m in config.metrics})
        self.rules = [Rule(spec=spec, condition=parse_condition(spec.when, self.metrics.by_name)) for spec in config.rules]
        self.hits = {rule.spec.name: 0 for rule in self.rules}
        self.acted = {rule.spec.name: 0 for rule in self.rules}
        self.lr_factor = 1.0
        self.records = 0
        self.stopped_by: str | None = None
        self.failures = {rule.spec.name: 0 for rule in self.rules}
        """Times each rule's condition could not be evaluated (each counted as false)."""
        self.wants_samples = self.metrics.wants_samples() or any(
            name == "log_batch" for rule in self.rules for name, _ in rule.spec.operations()
        )

    @property
    def uses_evaluations(self) -> bool:
        """Whether a rule reacts to evaluations or asks for one (the loop then needs validation batches)."""
        return any("eval" in rule.spec.on or any(name == "evaluate" for name, _ in rule.spec.operations()) for rule in self.rules)

    def observe(self, observation: Observation) -> Actions:
        """Feed an event to the metrics, run the rules subscribed to it, and return what they ask."""
        self.metrics.observe(observation)
        actions = Actions()
        due = [rule for rule in self.rules if observation.event in rule.spec.on
               and (rule.spec.max_times is None or self.acted[rule.spec.name] < rule.spec.max_times)]
        values: dict[str, Any] = {**self.metrics.values(), "step": observation.step, "steps": self.steps} if due else {}
        budget_s = self.config.budget_ms / 1000
        for rule in due:
            spec = rule.spec
            try:
                holds = evaluate(rule.condition, values, budget_s)
            except ConditionError as e:
                holds = False
                self.failures[spec.name] += 1
                if self.failures[spec.name] == 1:
                    actions.records.append({"step": observation.step, "event": observation.event, "rule": spec.name, "operations": [],
                                            "alert": f"its condition could not be evaluated ({e}); it counts as false, now and whenever "
                                                     f"this happens again (see failures in the checkpoint's control state)"})
            if holds:
                self.hits[spec.name] += 1
            elif spec.patience.mode == "reset_on_false":
                self.hits[spec.name] = 0
            if self.hits[spec.name] < spec.patience.threshold:
                continue
            self.hits[spec.name] = 0
            self.acted[spec.name] += 1
            record: dict[str, Any] = {"step": observation.step, "event": observation.event, "rule": spec.name,
                                      "operations": [name for name, _ in spec.operations()]}
            for name, argument in spec.operations():
                OPERATIONS[name].apply(actions, record, argument, values)
            actions.records.append(record)
            if actions.stop and self.stopped_by is None:
                self.stopped_by = spec.name
        self.metrics.commit(observation, accepted=not actions.drops_update)
        self.lr_factor *= actions.lr_factor
        self.records += len(actions.records)
        return actions

    def state(self) -> dict[str, Any]:
        """Everything a resumed run needs to decide as this one would."""
        return {
            "metrics": {name: metric.state() for name, metric in self.metrics.by_name.items()},
            "hits": dict(self.hits), "acted": dict(self.acted), "lr_factor": self.lr_factor, "records": self.records,
            "stopped_by": self.stopped_by, "failures": dict(self.failures),
        }

    def load(self, state: dict[str, Any]) -> None:
        """Inverse of `state`."""
        for name, metric_state in state["metrics"].items():
            self.metrics.by_name[name].load(metric_state)
        self.hits.update(state["hits"])
        self.acted.update(state["acted"])
        self.lr_factor, self.records, self.stopped_by = state["lr_factor"], state["records"], state["stopped_by"]
        self.failures.update(state.get("failures", {}))
