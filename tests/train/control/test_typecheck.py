"""The static type check of conditions: true/false on every branch and every window length, growth bounded, or refused."""

import math

import pytest

from factory.config.control import ControlConfig
from factory.train.control import Controller, Observation, problems
from factory.train.control.expression import FUNCTIONS, evaluate, parse_condition
from factory.train.control.typecheck import SIGNATURES

METRICS = [{"name": "history", "kind": "history", "window": 5}, {"name": "batch", "kind": "batch_inspector", "window": 4}]
POWERS = "step ** 60 * step ** 60 * step ** 60 * step ** 60 > 1"
"""Fine at step 1 (1 > 1 is false), 20**240 at step 20: beyond any float."""


def refusal(when: str, steps: int | None = 100) -> str:
    config = ControlConfig.model_validate({"metrics": METRICS, "rules": [{"name": "r", "when": when, "do": ["stop"]}]})
    found = [message for keys, message in problems(config, steps) if keys == ("control", "rules", 0, "when")]
    return found[0] if found else ""


@pytest.mark.parametrize(("when", "says"), [
    ("history.loss if step > 5 else step > 0", "both branches of 'history.loss if step > 5 else step > 0' must be true/false"),
    ("step > 0 if step > 5 else history.loss", "'history.loss' is a window"),
    ("history.loss or step > 0", "'or' gives one of its operands, so each must be true/false, but 'history.loss' is a window"),
    ("step > 0 or batch.loss", "'batch.loss' is a number"),
    ("step > 0 and mean(history.loss)", "'and' gives one of its operands"),
    ("not history.loss", "'not' takes true/false"),
    ("(step if step > 5 else steps)", "it must be true or false, but gives a number"),
    ("mean(history.loss)", "must be true or false"),
    ("(step > 1) == (step > 2)", "comparisons need numbers"),
    ("history.loss > 1", "comparisons need numbers"),
    ("batch > 1", "the metric 'batch'"),
    ("history.loss + 1 > 1", "'+' takes numbers"),
    ("step > 1 if history.loss else step > 2", "the test of 'x if test else y' must be true/false"),
    ("min(step) > 1", "min() of one argument takes a window"),
    ("mean(step) > 1", "mean() takes a window"),
    ("mean(history.loss, history.loss) > 1", "mean() takes one window"),
    ("abs(history.loss) > 1", "abs() takes a number"),
    ("isfinite(history.loss)", "isfinite() takes a number"),
    ("history.loss[step] > 1", "a window index is a whole number written out"),
    ("history.loss[-1.0] > 1", "a window index is a whole number written out"),
    ("history.loss[::0] > 1", "slice bounds are whole numbers written out"),
    ("batch.loss[-1] > 1", "only windows can be indexed"),
    (POWERS, "'step ** 60 * step ** 60 * step ** 60' can reach more than a float holds by step 100, beyond 1e+300"),
    ("batch.loss ** 2 > 1", "'**' above 1 needs a base of known size"),
    ("step ** step > 1", "the exponent of '**' must be a number written out"),
    ("2 ** 65 > 1", "the exponent of '**' must be a number written out, at most 64"),
    (" * ".join(["1000000000000000"] * 20) + " * 10 > 1", "can reach 1e+301 by step 100, beyond 1e+300"),
    ("steps / 1e-15 / 1e-15 / 1e-15 / 1e-15 / 1e-15 / 1e-15 / 1e-15 / 1e-15 / 1e-15 / 1e-15 / 1e-15 / 1e-15 / 1e-15 / 1e-15 "
     "/ 1e-15 / 1e-15 / 1e-15 / 1e-15 / 1e-15 / 1e-15 > 1", "beyond 1e+300"),
])
def test_conditions_not_true_or_false_everywhere_or_unbounded_are_refused(when, says):
    assert says in refusal(when)


@pytest.mark.parametrize("when", [
    "step > 5 if steps > 10 else step > 0",
    "(step if step > 5 else steps) > 3",
    "(history.loss if step > 5 else history.grad_norm)[-1] > 1",
    "len(history.eval_loss) >= 4 and max(history.eval_loss[-4:]) - history.eval_loss[-1] < 0.005",
    "batch.count >= 20 and batch.loss > batch.mean_loss + 6 * batch.std_loss",
    "isfinite(batch.loss) or not step > 0",
    "batch.loss * batch.loss * batch.loss > 1e15",  # data has no bound; its arithmetic may give inf, which compares
    "step / (steps - step) > 2",
    "step ** 2 + steps ** 2 > 4 and (batch.count / 2) ** 3 > 1 and len(history.loss) ** 0.5 < 3",
    "min(step, steps, 3) < max(batch.loss, 0) and sum(history.loss) >= 0 and std(batch.sample_losses) >= 0",
    "True",
    "batch.loss ** 0.5 > 1 and batch.loss ** 1 > 1 and batch.loss ** 0 == 1",  # roots of any size stay finite
    "step ** -1 > 0.5 and (step - 10) ** 0.5 >= 0 and (steps / 2) ** 2 > 1",  # 0 ** -1 is inf, (-1) ** 0.5 is nan
])
def test_conditions_true_or_false_everywhere_are_accepted(when):
    assert refusal(when) == ""


def test_a_product_of_powers_is_bounded_by_the_planned_steps():
    assert refusal(POWERS, steps=5) == ""  # 5**240 fits
    assert "by step 100" in refusal(POWERS, steps=100)
    assert "by step 1000000000" in refusal(POWERS, steps=None)  # unknown: up to a billion steps


def test_every_function_has_a_signature():
    assert SIGNATURES.keys() == FUNCTIONS.keys()


def holds(text: str, values) -> bool:
    return evaluate(parse_condition(text, {"history": None, "batch": None}), values, budget_s=1.0)


def test_empty_windows_make_the_condition_false_and_inf_and_nan_compare():
    controller = Controller(ControlConfig.model_validate({"metrics": METRICS, "rules": []}), steps=10)
    values = {**controller.metrics.values(), "step": 0, "steps": 10}
    for waiting in ("mean(history.loss) < 100", "history.loss[-1] < 100", "not mean(history.loss) > 100", "std(history.loss) >= 0"):
        assert holds(waiting, values) is False  # an empty window: the whole condition waits, `not` included
    assert holds("sum(history.loss) == 0 and len(history.loss) == 0", values) is True  # defined on an empty window
    controller.metrics.observe(Observation(event="step_end", step=1, loss=math.inf, grad_norm=math.nan, lr=1e308, tokens_per_second=1.0))
    values = {**controller.metrics.values(), "step": 1, "steps": 10}
    assert holds("history.loss[-1] * 2 > 100", values) is True
    assert holds("history.grad_norm[-1] > 0 or history.grad_norm[-1] <= 0", values) is False
    assert holds("history.lr[-1] * 10 > 1e15 and std(history.lr) == 0", values) is True  # overflow is inf, not an error
    assert holds("step - 1 == 0 and (step - 1) ** -1 > 1e15 and (step - 2) ** 0.5 != (step - 2) ** 0.5", values) is True
