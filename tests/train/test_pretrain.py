"""The pretraining loop: learning-rate schedule, learning, checkpoints, metrics and determinism."""

import hashlib
import json
import logging
import math

import pytest
import torch

from factory.config.schema import ModelConfig, PretrainConfig
from factory.data.loader import Batch, LoaderState
from factory.errors import FactoryError
from factory.train.pretrain import CHECKPOINT_DIR, METRICS_FILE, POSITIONS_FILE, last_logged_step, load_weights, lr_at, pretrain

LOG = logging.getLogger("test.pretrain")
VOCAB = 16
MODEL = ModelConfig(n_layer=1, n_head=2, n_embd=32, context=16)
LLAMA = ModelConfig(arch="llama", n_layer=1, n_head=2, n_kv_head=1, n_embd=32, context=16)
TRAIN = PretrainConfig(steps=30, batch_size=8, lr=1e-2, warmup_steps=3, checkpoint_every=10, log_every=5, keep_last=5)
FINAL = f"{CHECKPOINT_DIR}/step_000030.pt"
TOKENS = torch.arange(8, dtype=torch.int64).repeat(100)  # 0..7 over and over: trivially predictable


def batches(steps: int | None = None, state: LoaderState | None = None):
    """Batches of windows of TOKENS, each tagged with the position after it (a stand-in for a blend)."""
    step = state.slot if state else 0
    while steps is None or step < steps:
        starts = [(step * 8 + i) % 50 for i in range(TRAIN.batch_size)]
        x = torch.stack([TOKENS[s : s + MODEL.context] for s in starts])
        y = torch.stack([TOKENS[s + 1 : s + 1 + MODEL.context] for s in starts])
        step += 1
        yield Batch(x=x, y=y, documents=(), state=LoaderState(slot=step), real_tokens=y.numel(), global_tokens=y.numel())


def source(steps: int | None = None):
    """A batch source: batches from a position on."""
    return lambda state: batches(steps, state)


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    seen = []
    result = pretrain(source(), VOCAB, MODEL, TRAIN, 0, out, LOG, on_metrics=lambda step, row: seen.append((step, row)))
    return out, result, seen


def test_lr_warms_up_linearly_then_decays_by_cosine_to_the_floor():
    config = PretrainConfig(steps=100, lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    lrs = [lr_at(step, config) for step in range(config.steps)]
    assert lrs[0] == pytest.approx(1e-4)
    assert lrs[0] < lrs[5] < lrs[9]
    assert lrs[9] == pytest.approx(1e-3)
    assert lrs[10] == pytest.approx(1e-3)
    assert max(lrs) == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[-1] == pytest.approx(1e-4)
    progress = (55 - 10) / (100 - 10 - 1)  # the cosine runs over the 89 steps after warmup
    assert lr_at(55, config) == pytest.approx(1e-4 + 0.5 * 9e-4 * (1 + math.cos(math.pi * progress)))


def test_lr_without_warmup_starts_at_the_peak():
    config = PretrainConfig(steps=5, lr=0.5, warmup_steps=0, min_lr_ratio=0.0)
    assert lr_at(0, config) == pytest.approx(0.5)
    assert lr_at(4, config) == pytest.approx(0.0)


def test_loss_goes_down_on_a_repetitive_stream(run):
    out, result, _ = run
    rows = [json.loads(line) for line in (out / METRICS_FILE).read_text().splitlines()]
    assert [row["step"] for row in rows] == [5, 10, 15, 20, 25, 30]
    assert rows[-1]["loss"] < 0.5 * rows[0]["loss"]
    assert result.final_loss == pytest.approx(rows[-1]["loss"], abs=1e-5)
    assert all(set(row) == {"step", "loss", "lr", "grad_norm", "tokens_per_second", "step_seconds", "rss_peak_mb", "activations_mb",
                            "activations_saved_mb"} for row in rows)
    assert all(row["activations_mb"] > 0 and row["activations_saved_mb"] == 0 for row in rows)  # nothing is recomputed
    assert all(row["tokens_per_second"] > 0 and row["step_seconds"] > 0 and row["rss_peak_mb"] > 50 for row in rows)  # torch alone is more


def test_metrics_reach_the_sink_as_they_are_logged(run):
    out, _, seen = run
    rows = [json.loads(line) for line in (out / METRICS_FILE).read_text().splitlines()]
    assert [step for step, _ in seen] == [row["step"] for row in rows]
    assert [row for _, row in seen] == rows


def test_writes_step_checkpoints_and_a_final_one(run):
    out, result, _ = run
    assert result.checkpoints == ("step_000010.pt", "step_000020.pt", "step_000030.pt")
    assert sorted(p.name for p in out.iterdir()) == sorted([CHECKPOINT_DIR, METRICS_FILE, POSITIONS_FILE])
    assert sorted(p.name for p in (out / CHECKPOINT_DIR).iterdir()) == sorted(
        [*result.checkpoints, *(c.replace(".pt", ".json") for c in result.checkpoints)]
    )
    assert result.steps == 30
    assert result.tokens_seen == 30 * 8 * 16  # every target is real: no padding in these batches


def test_checkpoint_holds_model_optimizer_and_step(run):
    out, result, _ = run
    state = torch.load(out / CHECKPOINT_DIR / "step_000020.pt", weights_only=True)
    assert state["step"] == 20
    assert {"model", "optimizer", "data_position", "rng", "tokens_seen"} <= set(state)
    assert state["data_position"]["slot"] == 20  # the loader position after the 20th batch
    assert len(state["rng"]) == 1 and "torch" in state["rng"][0]  # one RNG state per rank
    assert state["optimizer"]["state"]  # AdamW moments exist after 20 steps
    assert torch.load(out / FINAL, weights_only=True)["step"] == 30
    weights = load_weights(out / FINAL)
    assert "wte.weight" in weights
    assert sum(w.numel() for k, w in weights.items() if k != "lm_head.weight") == result.parameters
    assert not torch.equal(weights["wte.weight"], state["model"]["wte.weight"])


def test_same_seed_gives_a_byte_identical_final_checkpoint(run, tmp_path):
    out, _, _ = run
    pretrain(source(), VOCAB, MODEL, TRAIN, 0, tmp_path / "again", LOG)
    assert sha256(tmp_path / "again" / FINAL) == sha256(out / FINAL)
    pretrain(source(), VOCAB, MODEL, TRAIN, 1, tmp_path / "other", LOG)
    assert sha256(tmp_path / "other" / FINAL) != sha256(out / FINAL)


def test_a_llama_learns_and_the_same_seed_gives_the_same_bytes(run, tmp_path):
    first = pretrain(source(), VOCAB, LLAMA, TRAIN, 0, tmp_path / "a", LOG)
    pretrain(source(), VOCAB, LLAMA, TRAIN, 0, tmp_path / "b", LOG)
    assert sha256(tmp_path / "a" / FINAL) == sha256(tmp_path / "b" / FINAL)
    assert first.final_loss < 0.25 * math.log(VOCAB)
    weights = load_weights(tmp_path / "a" / FINAL)
    assert "embed_tokens.weight" in weights and first.parameters == sum(w.numel() for k, w in weights.items() if k != "lm_head.weight")


def test_data_running_out_is_refused_with_what_to_change(tmp_path):
    with pytest.raises(FactoryError, match="ran out of documents after 12 of 30 steps.*oversample"):
        pretrain(source(12), VOCAB, MODEL, TRAIN, 0, tmp_path, LOG)
    assert not (tmp_path / FINAL).exists()
    assert (tmp_path / CHECKPOINT_DIR / "step_000010.pt").exists(), "the last good checkpoint is kept"


def test_data_positions_record_where_every_logged_step_started(run):
    out, _, _ = run
    rows = [json.loads(line) for line in (out / POSITIONS_FILE).read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 5, 10, 15, 20, 25]
    assert [row["state"]["slot"] for row in rows] == [0, 5, 10, 15, 20, 25]


def test_compiled_training_matches_eager_training(tmp_path):
    config = TRAIN.model_copy(update={"steps": 3, "checkpoint_every": 0, "warmup_steps": 1})
    pretrain(source(), VOCAB, MODEL, config, 0, tmp_path / "eager", LOG)
    pretrain(source(), VOCAB, MODEL, config.model_copy(update={"compile": True}), 0, tmp_path / "compiled", LOG)
    eager = load_weights(tmp_path / "eager" / CHECKPOINT_DIR / "step_000003.pt")
    compiled = load_weights(tmp_path / "compiled" / CHECKPOINT_DIR / "step_000003.pt")
    assert set(compiled) == set(eager), "the checkpoint holds the model's own names, not the compiled wrapper's"
    for name, weight in eager.items():
        torch.testing.assert_close(compiled[name], weight, rtol=1e-3, atol=1e-4)  # fused kernels round differently


def test_the_last_logged_step_is_what_a_relaunched_stage_skips_in_the_tracker(run, tmp_path):
    out, _, _ = run
    assert last_logged_step(out / METRICS_FILE) == TRAIN.steps
    assert last_logged_step(tmp_path / "never-written.jsonl") == 0


def test_checkpoint_at_start_saves_the_starting_weights_as_step_0_and_retention_keeps_them(tmp_path):
    from factory.models.build import build_model

    init = build_model(MODEL, VOCAB, seed=7).state_dict()  # not what seed 0 would build
    config = TRAIN.model_copy(update={"steps": 6, "checkpoint_every": 2, "keep_last": 1, "warmup_steps": 1, "log_every": 2,
                                      "checkpoint_at_start": True})
    pretrain(source(), VOCAB, MODEL, config, 0, tmp_path / "run", LOG, init=init)
    kept = sorted(p.name for p in (tmp_path / "run" / CHECKPOINT_DIR).glob("*.pt"))
    assert kept[0] == "step_000000.pt" and "step_000006.pt" in kept and "step_000002.pt" not in kept  # 0 survives keep_last 1
    start = load_weights(tmp_path / "run" / CHECKPOINT_DIR / "step_000000.pt")
    assert all(torch.equal(start[name], tensor) for name, tensor in init.items())  # exactly the weights it started from
    record = json.loads((tmp_path / "run" / CHECKPOINT_DIR / "step_000000.json").read_text())
    assert record["metrics"] == {"lr": lr_at(0, config), "tokens_seen": 0}  # no loss: never the best by loss
    unset = TRAIN.model_copy(update={"checkpoint_at_start": False})
    assert "checkpoint_at_start" not in unset.model_dump() and config.model_dump()["checkpoint_at_start"] is True  # old fingerprints hold
