"""The controller on its own: metric kinds, operations, patience modes, and what `problems` reports."""


import pytest

from factory.config.control import ControlConfig
from factory.errors import ConfigError
from factory.train.control import Controller, Observation, problems


def control(rules, metrics=None, **extra) -> ControlConfig:
    metrics = metrics if metrics is not None else [{"name": "h", "kind": "history", "window": 3}, {"name": "batch", "kind": "batch_inspector", "window": 4}]
    return ControlConfig.model_validate({"metrics": metrics, "rules": rules, **extra})


def step(n: int, loss: float = 1.0, samples=(1.0, 1.0)) -> Observation:
    return Observation(event="step_end", step=n, loss=loss, grad_norm=0.5, lr=1e-3, tokens_per_second=100.0, sample_losses=samples)


def test_history_keeps_sliding_windows_and_the_best_eval():
    controller = Controller(control([]), steps=100)
    for n, loss in enumerate([4.0, 3.0, 2.0, 1.0], start=1):
        controller.observe(step(n, loss))
    for n, eval_loss in [(10, 2.0), (20, 1.5), (30, 1.7), (40, 1.6)]:
        controller.observe(Observation(event="eval", step=n, eval_loss=eval_loss))
    values = controller.metrics.values()["h"]
    assert values["loss"] == [3.0, 2.0, 1.0]
    assert values["grad_norm"] == [0.5, 0.5, 0.5]
    assert values["eval_loss"] == [1.5, 1.7, 1.6]
    assert values["best_eval_loss"] == 1.5
    assert values["evals_since_best"] == 2


def test_batch_inspector_compares_a_batch_with_the_accepted_ones_before_it():
    controller = Controller(control([{"name": "spike", "when": "batch.count >= 2 and batch.loss > 3 * batch.mean_loss", "do": ["skip_batch"]}]), 10)
    assert not controller.observe(step(1, 1.0)).skip_batch
    assert not controller.observe(step(2, 2.0)).skip_batch
    assert controller.observe(step(3, 9.0, samples=(0.5, 17.5))).skip_batch
    values = controller.metrics.values()["batch"]
    assert values["max_sample_loss"] == 17.5
    assert values["mean_loss"] == pytest.approx(1.5)  # the skipped spike did not enter the statistics
    assert values["std_loss"] == pytest.approx(0.5)
    assert not controller.observe(step(4, 2.0)).skip_batch


@pytest.mark.parametrize(("mode", "pattern", "fires_at"), [
    ("reset_on_false", [1, 1, 0, 1, 1, 1], [6]),
    ("cumulative", [1, 1, 0, 1, 1, 1], [4]),
])
def test_patience_modes(mode, pattern, fires_at):
    rule = {"name": "high", "when": "batch.loss > 5", "patience": {"threshold": 3, "mode": mode}, "do": ["checkpoint"]}
    controller = Controller(control([rule]), 100)
    fired = [n for n, high in enumerate(pattern, start=1) if controller.observe(step(n, 9.0 if high else 1.0)).checkpoint]
    assert fired == fires_at


def test_max_times_limits_how_often_a_rule_acts():
    controller = Controller(control([{"name": "always", "when": "step > 0", "do": [{"log": "at {step}"}], "max_times": 2}]), 100)
    records = [r for n in range(1, 6) for r in controller.observe(step(n)).records]
    assert [r["messages"] for r in records] == [["at 1"], ["at 2"]]


def test_operations_compose_in_order_and_record_what_they_did():
    rule = {"name": "spike", "when": "batch.loss > 5", "do": ["log_batch", {"log": "loss {batch.loss} over {batch.mean_loss}"}, {"scale_lr": 0.5},
                                                              {"alert": "spike at {step}"}, "checkpoint", "evaluate", "rewind", "stop"]}
    controller = Controller(control([rule]), 100)
    controller.observe(step(1, 2.0))
    actions = controller.observe(step(2, 8.0))
    assert (actions.checkpoint, actions.evaluate, actions.rewind, actions.stop, actions.skip_batch) == (True, True, True, True, False)
    assert actions.lr_factor == 0.5 and controller.lr_factor == 0.5
    [record] = actions.records
    assert record["operations"] == ["log_batch", "log", "scale_lr", "alert", "checkpoint", "evaluate", "rewind", "stop"]
    assert record["messages"] == ["loss 8 over 2"]
    assert record["alert"] == "spike at 2"
    assert record["batch"] is True  # the loop fills in the documents and per-sequence losses
    assert controller.stopped_by == "spike"


def test_templates_never_reach_attributes():
    controller = Controller(control([{"name": "x", "when": "step > 0", "do": [{"log": "{batch.__class__} {0.__class__} {step!r:>99999}"}]}]), 10)
    [record] = controller.observe(step(1)).records
    assert record["messages"] == ["{batch.__class__} {0.__class__} {step!r:>99999}"]


def test_state_round_trips_so_a_resumed_run_decides_alike():
    config = control([{"name": "plateau", "on": ["eval"], "when": "h.evals_since_best >= 2", "patience": {"threshold": 2}, "do": ["stop"]}])
    first = Controller(config, 100)
    for n, value in [(10, 2.0), (20, 2.1), (30, 2.2)]:
        first.observe(Observation(event="eval", step=n, eval_loss=value))
    second = Controller(config, 100)
    second.load(first.state())
    assert second.metrics.values() == first.metrics.values() | {"h": {**first.metrics.values()["h"], "tokens_per_second": []}}
    assert first.observe(Observation(event="eval", step=40, eval_loss=2.3)).stop
    assert second.observe(Observation(event="eval", step=40, eval_loss=2.3)).stop


def test_an_empty_window_waits_and_a_broken_value_is_a_logged_false_not_a_failed_run():
    waiting = Controller(control([{"name": "late", "on": ["eval"], "when": "h.eval_loss[0] > 1", "do": ["stop"]}]), 10)
    assert not waiting.observe(step(1)).stop  # not subscribed to step_end
    assert waiting.observe(Observation(event="eval", step=1, eval_loss=2.0)).stop
    bad = Controller(control([{"name": "typed", "on": ["eval"], "when": "h.loss[-1] > 0", "do": ["stop"]}]), 10)
    bad.metrics.by_name["h"].windows["loss"].append(True)  # a value of the wrong type, as a broken metric kind could give
    first = bad.observe(Observation(event="eval", step=2, eval_loss=1.0))
    assert not first.stop
    [record] = first.records
    assert record["rule"] == "typed" and record["operations"] == [] and "needs numbers" in record["alert"], record
    again = bad.observe(Observation(event="eval", step=3, eval_loss=1.0))
    assert not again.stop and again.records == []  # recorded once, counted always
    assert bad.state()["failures"] == {"typed": 2}


@pytest.mark.parametrize(("rule", "metrics", "where", "message"), [
    ({"name": "r", "when": "h.losss[-1] > 1", "do": ["stop"]}, None, ("control", "rules", 0, "when"), "h.losss is not a field of a History metric"),
    ({"name": "r", "when": "h.loss", "do": ["stop"]}, None, ("control", "rules", 0, "when"), "must be true or false"),
    ({"name": "r", "when": "mean(h.loss)", "do": ["stop"]}, None, ("control", "rules", 0, "when"), "must be true or false"),
    ({"name": "r", "when": "h.loss > 1", "do": ["stop"]}, None, ("control", "rules", 0, "when"), "comparisons need numbers"),
    ({"name": "r", "when": "x.loss > 1", "do": ["stop"]}, None, ("control", "rules", 0, "when"), "must follow a metric name"),
    ({"name": "r", "when": "step > 1", "do": ["explode"]}, None, ("control", "rules", 0, "do", 0), "unknown operation 'explode'"),
    ({"name": "r", "when": "step > 1", "do": [{"stop": 1}]}, None, ("control", "rules", 0, "do", 0), "stop takes no argument"),
    ({"name": "r", "when": "step > 1", "do": ["log"]}, None, ("control", "rules", 0, "do", 0), "log: expected a message"),
    ({"name": "r", "when": "step > 1", "do": [{"scale_lr": 0}]}, None, ("control", "rules", 0, "do", 0), "scale_lr: expected a factor"),
    ({"name": "r", "on": ["eval"], "when": "step > 1", "do": ["skip_batch"]}, None, ("control", "rules", 0, "do", 0), "skip_batch cannot run at eval"),
    ({"name": "r", "when": "step > 1", "do": ["stop"]}, [{"name": "h", "kind": "histogram"}], ("control", "metrics", 0, "kind"), "unknown metric kind"),
])
def test_problems_name_the_field_and_what_is_allowed(rule, metrics, where, message):
    found = problems(control([rule], metrics))
    assert any(keys == where and message in text for keys, text in found), found
    with pytest.raises(ConfigError):
        Controller(control([rule], metrics), 10)


def test_a_condition_out_of_time_counts_as_false_and_the_run_goes_on():
    slow = Controller(control([{"name": "slow", "when": "mean(h.loss) + std(h.loss) > 0", "do": ["stop"]}], budget_ms=1e-9), 10)
    first = slow.observe(step(1))
    assert not first.stop and "time budget" in first.records[0]["alert"], first.records
    assert not slow.observe(step(2)).stop and slow.failures == {"slow": 2}
