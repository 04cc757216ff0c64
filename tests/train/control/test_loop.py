"""Control rules inside the real training loop: a spike skipped or rewound, a plateau stopped, resume, records."""

import hashlib
import json
import logging

import pytest
import torch

from factory.config.control import ControlConfig
from factory.config.schema import ModelConfig, PretrainConfig
from factory.data.loader import Batch, LoaderState
from factory.train.checkpoint import CheckpointDir, RetentionPolicy
from factory.train.pretrain import CHECKPOINT_DIR, CONTROL_FILE, pretrain

LOG = logging.getLogger("test.control")
VOCAB = 16
MODEL = ModelConfig(n_layer=1, n_head=2, n_embd=32, context=16)
LLAMA = ModelConfig(arch="llama", n_layer=1, n_head=2, n_kv_head=1, n_embd=32, context=16)
TRAIN = PretrainConfig(steps=40, batch_size=8, lr=1e-2, warmup_steps=3, checkpoint_every=10, log_every=5, keep_last=10)
PATTERN = torch.arange(8, dtype=torch.int64).repeat(100)  # 0..7 over and over: quickly learned
SPIKE_AT = 27  # the step whose batch is noise


def batch_at(step: int, noise: bool = False) -> Batch:
    starts = [(step * 8 + i) % 50 for i in range(TRAIN.batch_size)]
    x = torch.stack([PATTERN[s : s + MODEL.context] for s in starts])
    y = torch.stack([PATTERN[s + 1 : s + 1 + MODEL.context] for s in starts])
    if noise:
        y = torch.randint(0, VOCAB, y.shape, generator=torch.Generator().manual_seed(step))
    documents = tuple((f"doc-{step}-{i}",) for i in range(TRAIN.batch_size))
    return Batch(x=x, y=y, documents=documents, state=LoaderState(slot=step + 1), real_tokens=y.numel(), global_tokens=y.numel())


def source(spike_at: int | None = SPIKE_AT, crash_at: int | None = None):
    def batches(state: LoaderState | None):
        step = state.slot if state else 0
        while True:
            if step == crash_at:
                raise RuntimeError("the machine went away")
            yield batch_at(step, noise=step + 1 == spike_at)
            step += 1

    return batches


VALIDATION = [batch_at(1000 + i) for i in range(2)]
SPIKE_RULE = {"name": "spike", "when": "batch.count >= 5 and batch.loss > 3 * batch.mean_loss", "do": ["log_batch"]}


def control(*rules, **extra) -> ControlConfig:
    metrics = [{"name": "h", "kind": "history", "window": 5}, {"name": "batch", "kind": "batch_inspector", "window": 10}]
    return ControlConfig.model_validate({"metrics": metrics, "rules": list(rules), **extra})


def records(work) -> list[dict]:
    return [json.loads(line) for line in (work / CONTROL_FILE).read_text().splitlines()]


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def optimizer_steps(path) -> int:
    state = torch.load(path, map_location="cpu", weights_only=True)
    return int(state["optimizer"]["state"][0]["step"])


def test_an_injected_spike_is_found_logged_with_its_batch_and_skipped(tmp_path):
    rule = {**SPIKE_RULE, "do": ["log_batch", "skip_batch"]}
    result = pretrain(source(), VOCAB, MODEL, TRAIN, 0, tmp_path, LOG, control=control(rule), validation=VALIDATION)
    [record] = records(tmp_path)
    assert (record["rule"], record["step"], record["operations"]) == ("spike", SPIKE_AT, ["log_batch", "skip_batch"])
    assert record["batch"]["documents"] == [[f"doc-{SPIKE_AT - 1}-{i}"] for i in range(TRAIN.batch_size)]  # per sequence
    assert len(record["batch"]["sample_losses"]) == TRAIN.batch_size and min(record["batch"]["sample_losses"]) > 1.0
    assert result.steps == TRAIN.steps and result.steps_computed == TRAIN.steps
    assert optimizer_steps(tmp_path / CHECKPOINT_DIR / "step_000040.pt") == TRAIN.steps - 1  # one update was not applied


def test_without_the_rule_the_spike_is_trained_on(tmp_path):
    pretrain(source(), VOCAB, MODEL, TRAIN, 0, tmp_path, LOG, control=control(SPIKE_RULE), validation=VALIDATION)
    assert [r["step"] for r in records(tmp_path)] == [SPIKE_AT]
    assert optimizer_steps(tmp_path / CHECKPOINT_DIR / "step_000040.pt") == TRAIN.steps


def test_a_spike_can_rewind_to_the_last_checkpoint_and_skip_ahead_in_the_data(tmp_path):
    rule = {**SPIKE_RULE, "do": ["rewind"]}
    result = pretrain(source(), VOCAB, MODEL, TRAIN, 0, tmp_path, LOG, control=control(rule), validation=VALIDATION)
    [record] = records(tmp_path)
    assert record["operations"] == ["rewind"]
    assert result.steps == TRAIN.steps
    assert result.steps_computed == TRAIN.steps + (SPIKE_AT - 20)  # steps 21..27 were computed twice
    assert result.tokens_seen == result.steps_computed * TRAIN.batch_size * MODEL.context  # the data went on, never repeated
    assert optimizer_steps(tmp_path / CHECKPOINT_DIR / "step_000040.pt") == TRAIN.steps


def test_a_plateau_stops_the_run_with_a_final_checkpoint_and_a_relaunch_stays_stopped(tmp_path):
    plateau = {"name": "plateau", "on": ["eval"], "when": "h.evals_since_best >= 1 or h.eval_loss[-1] < 0.05",
               "patience": {"threshold": 2, "mode": "cumulative"}, "do": ["checkpoint", "stop", {"log": "best {h.best_eval_loss}"}]}
    config = control(plateau, eval_every=4)
    long = TRAIN.model_copy(update={"steps": 400, "checkpoint_every": 0})
    result = pretrain(source(spike_at=None), VOCAB, MODEL, long, 0, tmp_path, LOG, control=config, validation=VALIDATION)
    assert result.stopped_by == "plateau"
    assert result.steps < long.steps and result.steps % 4 == 0
    kept = CheckpointDir(tmp_path / CHECKPOINT_DIR, RetentionPolicy(), LOG).complete()
    assert kept[-1].step == result.steps
    [record] = records(tmp_path)
    assert record["step"] == result.steps and record["event"] == "eval" and record["messages"][0].startswith("best ")
    final = sha256(kept[-1].path)
    again = pretrain(source(spike_at=None), VOCAB, MODEL, long, 0, tmp_path, LOG, control=config, validation=VALIDATION)
    assert (again.steps, again.steps_computed, again.stopped_by) == (result.steps, 0, "plateau")
    assert sha256(kept[-1].path) == final
    assert len(records(tmp_path)) == 1


@pytest.mark.parametrize("model", [MODEL, LLAMA], ids=["gpt", "llama"])
def test_a_crashed_controlled_run_resumes_to_the_same_bytes(tmp_path, model):
    rules = [{**SPIKE_RULE, "do": ["log_batch", "skip_batch"]},
             {"name": "slow", "on": ["eval"], "when": "h.evals_since_best >= 1", "do": [{"scale_lr": 0.5}]}]
    config = control(*rules, eval_every=5)
    pretrain(source(), VOCAB, model, TRAIN, 0, tmp_path / "whole", LOG, control=config, validation=VALIDATION)
    with pytest.raises(RuntimeError):
        pretrain(source(crash_at=33), VOCAB, model, TRAIN, 0, tmp_path / "crashed", LOG, control=config, validation=VALIDATION)
    resumed = pretrain(source(), VOCAB, model, TRAIN, 0, tmp_path / "crashed", LOG, control=config, validation=VALIDATION)
    assert resumed.resumed_from == 30
    final = f"{CHECKPOINT_DIR}/step_000040.pt"
    assert sha256(tmp_path / "crashed" / final) == sha256(tmp_path / "whole" / final)
    assert records(tmp_path / "crashed") == records(tmp_path / "whole")


def test_a_rule_on_evaluations_needs_validation_batches(tmp_path):
    from factory.errors import ConfigError

    with pytest.raises(ConfigError, match="validation"):
        pretrain(source(), VOCAB, MODEL, TRAIN, 0, tmp_path, LOG, control=control(eval_every=5))


def test_rewind_then_stop_ends_on_the_last_good_checkpoint(tmp_path):
    keep = {"name": "keep", "on": ["eval"], "when": "step == 12", "do": ["checkpoint"]}
    late = {"name": "late", "on": ["eval"], "when": "step >= 20", "do": ["rewind", "stop"]}
    config = TRAIN.model_copy(update={"checkpoint_every": 0})
    result = pretrain(source(spike_at=None), VOCAB, MODEL, config, 0, tmp_path / "rewound", LOG,
                      control=control(keep, late, eval_every=4), validation=VALIDATION)
    assert (result.steps, result.steps_computed, result.stopped_by) == (12, 20, "late")
    plain = {"name": "plain", "on": ["eval"], "when": "step >= 12", "do": ["stop"]}
    pretrain(source(spike_at=None), VOCAB, MODEL, config, 0, tmp_path / "plain", LOG, control=control(plain, eval_every=4), validation=VALIDATION)
    weights = [torch.load(tmp_path / run / CHECKPOINT_DIR / "step_000012.pt", weights_only=True)["model"] for run in ("rewound", "plain")]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])
