"""Generated conditions: whatever `factory check` accepts gives true or false on every history, and whatever it refuses is named.

Conditions come from the grammar of the language (both well-typed ones and arbitrary mixes),
histories from real metrics fed observations of every length, with nan, inf and huge values.
"""

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factory.config.control import ControlConfig
from factory.errors import ConfigError
from factory.train.control import Controller, Observation, problems
from factory.train.control.expression import evaluate

STEPS = 40
METRICS = [{"name": "h", "kind": "history", "window": 3}, {"name": "b", "kind": "batch_inspector", "window": 4}]
NUMBER_FIELDS = ["h.best_eval_loss", "h.evals_since_best", "b.loss", "b.mean_loss", "b.std_loss", "b.count", "b.max_sample_loss"]
WINDOW_FIELDS = ["h.loss", "h.grad_norm", "h.lr", "h.tokens_per_second", "h.eval_loss", "b.sample_losses"]
LITERALS = st.sampled_from(["0", "1", "2", "3", "-1", "0.5", "64", "65", "1e15", "1000000000000000", "2.5"])


def wrap(template):
    return lambda parts: template.format(*parts) if isinstance(parts, tuple) else template.format(parts)


def _typed():
    """Strategies for number, window and true/false expressions that are well-typed (check may still refuse their growth)."""
    number = st.deferred(lambda: st.one_of(
        LITERALS, st.sampled_from(["step", "steps", *NUMBER_FIELDS]),
        st.tuples(number, st.sampled_from(["+", "-", "*", "/", "//", "%"]), number).map(wrap("({} {} {})")),
        st.tuples(number, st.sampled_from(["0", "1", "2", "3", "0.5", "-1", "60", "64"])).map(wrap("({} ** {})")),
        st.tuples(st.sampled_from(["len", "min", "max", "sum", "mean", "std"]), window).map(wrap("{}({})")),
        st.tuples(st.sampled_from(["min", "max"]), number, number).map(wrap("{}({}, {})")),
        number.map(wrap("abs({})")), number.map(wrap("(-{})")),
        st.tuples(window, st.sampled_from(["0", "-1", "2", "-3", "10"])).map(wrap("{}[{}]")),
        st.tuples(number, boolean, number).map(wrap("({} if {} else {})")),
    ))
    window = st.deferred(lambda: st.one_of(
        st.sampled_from(WINDOW_FIELDS),
        st.tuples(window, st.sampled_from(["-2:", ":2", "1:", "::2", "-3:-1"])).map(wrap("{}[{}]")),
        st.tuples(window, boolean, window).map(wrap("({} if {} else {})")),
    ))
    boolean = st.deferred(lambda: st.one_of(
        st.sampled_from(["True", "False"]),
        st.tuples(number, st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), number).map(wrap("({} {} {})")),
        st.tuples(boolean, st.sampled_from(["and", "or"]), boolean).map(wrap("({} {} {})")),
        boolean.map(wrap("(not {})")), number.map(wrap("isfinite({})")),
        st.tuples(boolean, boolean, boolean).map(wrap("({} if {} else {})")),
    ))
    return number, window, boolean


NUMBER, WINDOW, BOOLEAN = _typed()
ANY = st.deferred(lambda: st.one_of(NUMBER, WINDOW, BOOLEAN, st.just("h"), st.tuples(
    ANY, st.sampled_from(["and", "or", "+", "*", "**", "<", "=="]), ANY).map(wrap("({} {} {})")),
    st.tuples(ANY, ANY, ANY).map(wrap("({} if {} else {})")), ANY.map(wrap("(not {})")),
    st.tuples(st.sampled_from(["len", "min", "max", "sum", "mean", "std", "abs", "isfinite"]), ANY).map(wrap("{}({})")),
    st.tuples(ANY, ANY).map(wrap("{}[{}]")),
))
CONDITIONS = st.one_of(BOOLEAN, BOOLEAN.filter(lambda text: "**" not in text), ANY)
VALUE = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1e308, 0.0]))
OBSERVATIONS = st.lists(st.one_of(
    st.builds(lambda loss, norm, lr, tps, samples: ("step_end", loss, norm, lr, tps, tuple(samples)),
              VALUE, VALUE, VALUE, VALUE, st.lists(VALUE, max_size=3)),
    st.builds(lambda loss: ("eval", loss), VALUE),
), max_size=8)


def controller_for(condition: str) -> Controller | None:
    """The controller, or None after checking that `problems` refuses the condition with a message on its field."""
    config = ControlConfig.model_validate({"metrics": METRICS, "rules": [{"name": "r", "when": condition, "do": ["stop"]}]})
    found = problems(config, STEPS)
    if found:
        assert [keys for keys, _ in found] == [("control", "rules", 0, "when")], found
        assert all(message.strip() for _, message in found)
        return None
    try:
        return Controller(config, STEPS)
    except ConfigError as e:  # pragma: no cover - problems() and the controller must agree
        raise AssertionError(f"problems() accepted {condition!r} but the controller refused it: {e}") from e


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(condition=CONDITIONS, observations=OBSERVATIONS)
def test_an_accepted_condition_is_true_or_false_on_every_history(condition, observations):
    controller = controller_for(condition)
    if controller is None:
        return
    [rule] = controller.rules
    for length in range(len(observations) + 1):  # every history length, from no data at all
        if length:
            event, *fields = observations[length - 1]
            seen = (Observation(event="eval", step=length, eval_loss=fields[0]) if event == "eval" else
                    Observation(event="step_end", step=length, loss=fields[0], grad_norm=fields[1], lr=fields[2],
                                tokens_per_second=fields[3], sample_losses=fields[4]))
            controller.metrics.observe(seen)
            controller.metrics.commit(seen, accepted=True)
        for step in {length, STEPS}:
            values = {**controller.metrics.values(), "step": step, "steps": STEPS}
            result = evaluate(rule.condition, values, budget_s=60.0)
            assert result is True or result is False, (condition, values, result)


def test_the_grammar_gives_both_accepted_and_refused_conditions():
    """A guard on the property above: the conditions it sees are neither all refused nor all accepted (a fixed sample)."""
    refused: list[bool] = []

    @settings(max_examples=300, database=None, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
    @given(CONDITIONS)
    def sample(condition):
        refused.append(controller_for(condition) is None)

    sample()
    assert 0.2 < sum(refused) / len(refused) < 0.8, sum(refused)
