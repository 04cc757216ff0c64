"""Training control as code: metrics and rules from an experiment's `control:` section, run inside the loop."""

from factory.train.control.controller import Controller, problems
from factory.train.control.expression import ConditionError, evaluate, parse_condition
from factory.train.control.metrics import METRIC_KINDS, Metric, Observation, metric_kind
from factory.train.control.operations import OPERATIONS, Actions, Operation, register

__all__ = [
    "METRIC_KINDS", "OPERATIONS", "Actions", "ConditionError", "Controller", "Metric", "Observation", "Operation", "evaluate", "metric_kind",
    "parse_condition", "problems", "register",
]
