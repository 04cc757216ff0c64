"""Resume and ranks for real: SIGKILL at several points then relaunch gives the same bytes; 1 rank == 2 ranks."""

import contextlib
import hashlib
import json
import logging
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch

from factory.config.schema import ModelConfig, PretrainConfig
from factory.data.loader import Batch, LoaderState
from factory.errors import StageFailed
from factory.launch.warm import WarmProcess
from factory.train.checkpoint import CheckpointDir, RetentionPolicy, load_checkpoint
from factory.train.pretrain import CHECKPOINT_DIR, METRICS_FILE, pretrain
from tests.train.conftest import finish, launch

pytestmark = pytest.mark.slow  # about a minute and a half: two-rank worlds and SIGKILLed trainers

LOG = logging.getLogger("test.resume")


def final_sha(work: Path, steps: int = 60) -> str:
    return hashlib.sha256((work / CHECKPOINT_DIR / f"step_{steps:06d}.pt").read_bytes()).hexdigest()


def logged_steps(work: Path) -> int:
    try:
        lines = (work / METRICS_FILE).read_text().splitlines()
        return json.loads(lines[-1])["step"] if lines else 0
    except (OSError, ValueError, KeyError):
        return 0


@pytest.fixture(scope="module")
def reference(tmp_path_factory, warm) -> str:
    work = tmp_path_factory.mktemp("reference") / "work"
    finish(launch(work, warm=warm))
    return final_sha(work)


@pytest.mark.parametrize("kill_after", [3, 17, 41])
def test_sigkill_then_relaunch_gives_the_bytes_of_an_uninterrupted_run(tmp_path, reference, kill_after, warm):
    work = tmp_path / "work"
    process = launch(work, warm=warm)
    deadline = time.monotonic() + 120
    while logged_steps(work) < kill_after and process.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    process.kill()
    process.wait()
    killed_at = logged_steps(work)
    assert kill_after <= killed_at < 60, "the kill must land before the end"
    err = finish(launch(work, warm=warm))
    if killed_at >= 10:
        assert "resuming from step_" in err
    assert final_sha(work) == reference
    steps = [json.loads(line)["step"] for line in (work / METRICS_FILE).read_text().splitlines()]
    assert steps == list(range(1, 61)), "the resumed run rewrites the metrics of the steps it repeats, once"


def test_a_kill_during_a_checkpoint_write_loses_nothing(tmp_path, reference, warm):
    work = tmp_path / "work"
    process = launch(work, warm=warm)
    checkpoints = work / CHECKPOINT_DIR
    deadline = time.monotonic() + 120
    while process.poll() is None and not any(p.name.startswith("step_000030") for p in (checkpoints.iterdir() if checkpoints.exists() else [])):
        assert time.monotonic() < deadline
        time.sleep(0.0005)
    process.kill()
    process.wait()
    # Whatever the kill left (a temp file, bytes without a record, or a whole checkpoint), plus a save cut short by hand:
    (checkpoints / "step_000040.pt.tmp").write_bytes(b"partial")
    (checkpoints / "step_000040.pt").write_bytes(b"torn")
    err = finish(launch(work, warm=warm))
    assert "left by an interrupted save" in err
    assert final_sha(work) == reference
    assert not list(checkpoints.glob("*.tmp"))


def kill_tree(process: subprocess.Popen | WarmProcess) -> None:
    """SIGKILL torchrun and its ranks (which it starts in sessions of their own), as a node failing would."""
    family = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):  # a forked rank dies with its parent, maybe before its turn here
            member.kill()
    psutil.wait_procs(family, timeout=30)
    process.wait()


def weights_sha(state: dict) -> str:
    """The sha256 of a state's model tensors, in name order: the same for the same weights in either checkpoint format."""
    digest = hashlib.sha256()
    for name, tensor in sorted(state["model"].items()):
        digest.update(name.encode() + tensor.contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_sharded_checkpoints_from_two_ranks_resume_bitwise_after_sigkill_and_async_saves_change_nothing(tmp_path, parallelism, warm):
    whole, killed = tmp_path / "whole" / "work", tmp_path / "killed" / "work"
    whole.parent.mkdir()
    killed.parent.mkdir()
    finish(launch(whole, steps=30, ranks=2, sharded=True, parallelism=parallelism, warm=warm))
    final = whole / CHECKPOINT_DIR / "step_000030"
    shards = {p.name: p.stat().st_size for p in final.iterdir()}
    assert set(shards) == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    assert min(shards["__0_0.distcp"], shards["__1_0.distcp"]) > 0.2 * sum(shards.values()), f"each rank writes a share: {shards}"

    process = launch(killed, steps=30, ranks=2, sharded=True, asynchronous=True, parallelism=parallelism, warm=warm)
    deadline = time.monotonic() + 180
    record = killed / CHECKPOINT_DIR / "step_000010.json"  # the async save of step 10 is complete
    while (logged_steps(killed) < 15 or not record.exists()) and process.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    kill_tree(process)
    assert logged_steps(killed) < 30, "the kill must land before the end"
    err = finish(launch(killed, steps=30, ranks=2, sharded=True, asynchronous=True, parallelism=parallelism, warm=warm))
    assert "resuming from step_000010" in err or "resuming from step_000020" in err
    ours, theirs = (load_checkpoint(w / CHECKPOINT_DIR / "step_000030") for w in (killed, whole))
    assert weights_sha(ours) == weights_sha(theirs)
    assert len(ours["rng"]) == 2 and ours["step"] == 30 and ours["data_position"] == theirs["data_position"]
    for index, state in theirs["optimizer"]["state"].items():
        assert torch.equal(ours["optimizer"]["state"][index]["exp_avg_sq"], state["exp_avg_sq"])


def test_two_ranks_compute_what_one_rank_computes(tmp_path, warm):
    one, two = tmp_path / "one" / "work", tmp_path / "two" / "work"
    one.parent.mkdir()
    two.parent.mkdir()
    finish(launch(one, steps=12, every=0, dropout=0.0, warm=warm))  # dropout masks depend on how the batch is split
    finish(launch(two, steps=12, every=0, ranks=2, dropout=0.0, warm=warm))
    a = torch.load(one / CHECKPOINT_DIR / "step_000012.pt", weights_only=True)
    b = torch.load(two / CHECKPOINT_DIR / "step_000012.pt", weights_only=True)
    for name, weight in a["model"].items():
        torch.testing.assert_close(b["model"][name], weight, rtol=1e-3, atol=1e-4)  # float noise, amplified by Adam on tiny gradients
    assert len(b["rng"]) == 2, "every rank's RNG state is in the checkpoint"
    start = torch.load(one / CHECKPOINT_DIR / "step_000012.pt", weights_only=True)["rng"]
    assert len(start) == 1


def test_two_ranks_take_the_same_control_decisions_as_one(tmp_path, warm):
    control = json.dumps({"metrics": [{"name": "batch", "kind": "batch_inspector"}], "rules": [
        {"name": "look", "when": "step == 4", "do": ["log_batch"]},
        {"name": "skip", "when": "step == 6 or step == 7", "do": ["skip_batch"]},
    ]})
    runs = {}
    for ranks in (1, 2):
        work = tmp_path / str(ranks) / "work"
        work.parent.mkdir()
        finish(launch(work, steps=12, every=0, ranks=ranks, dropout=0.0, control=control, warm=warm))
        records = [json.loads(line) for line in (work / "control.jsonl").read_text().splitlines()]
        runs[ranks] = (records, torch.load(work / CHECKPOINT_DIR / "step_000012.pt", weights_only=True))
    (one, first), (two, second) = runs[1], runs[2]
    assert [(r["rule"], r["step"]) for r in one] == [(r["rule"], r["step"]) for r in two] == [("look", 4), ("skip", 6), ("skip", 7)]
    assert len(two[0]["batch"]["sample_losses"]) == 8, "both ranks' sequences are in the record"
    torch.testing.assert_close(torch.tensor(two[0]["batch"]["sample_losses"]), torch.tensor(one[0]["batch"]["sample_losses"]), rtol=1e-3, atol=1e-4)
    assert int(second["optimizer"]["state"][0]["step"]) == int(first["optimizer"]["state"][0]["step"]) == 10
    for name, weight in first["model"].items():
        torch.testing.assert_close(second["model"][name], weight, rtol=1e-3, atol=1e-4)


def test_gradient_accumulation_computes_what_one_pass_computes(tmp_path, warm):
    one, four = tmp_path / "one" / "work", tmp_path / "four" / "work"
    one.parent.mkdir()
    four.parent.mkdir()
    finish(launch(one, steps=8, every=0, dropout=0.0, warm=warm))
    finish(launch(four, steps=8, every=0, accum=4, dropout=0.0, warm=warm))
    a = torch.load(one / CHECKPOINT_DIR / "step_000008.pt", weights_only=True)["model"]
    b = torch.load(four / CHECKPOINT_DIR / "step_000008.pt", weights_only=True)["model"]
    for name, weight in a.items():
        torch.testing.assert_close(b[name], weight, rtol=1e-3, atol=1e-4)


def test_retention_keeps_the_last_k_and_the_best_and_logs_deletions(tmp_path, caplog):
    store = CheckpointDir(tmp_path, RetentionPolicy(keep_last=2, best_metric="loss"), LOG)
    with caplog.at_level(logging.INFO, logger=LOG.name):
        for step, loss in zip(range(1, 7), [5.0, 1.0, 4.0, 3.0, 2.5, 2.0], strict=True):
            store.save(step, {"step": step, "w": torch.full((4,), float(step))}, {"loss": loss})
    assert [c.step for c in store.complete()] == [2, 5, 6]
    deleted = [r.getMessage() for r in caplog.records if "deleted checkpoint" in r.getMessage()]
    assert len(deleted) == 3 and "step_000001.pt" in deleted[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"step_00000{s}.{e}" for s in (2, 5, 6) for e in ("json", "pt")]


def test_a_corrupt_checkpoint_is_skipped_for_the_one_before(tmp_path, caplog):
    store = CheckpointDir(tmp_path, RetentionPolicy(keep_last=3, best_metric=None), LOG)
    for step in (1, 2):
        store.save(step, {"step": step}, {})
    (tmp_path / "step_000002.pt").write_bytes(b"bit rot")
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        saved, state = store.latest()
    assert saved.step == 1 and state["step"] == 1
    assert any("does not match its checksum" in r.getMessage() for r in caplog.records)


def test_asynchronous_saves_write_the_same_bytes(tmp_path):
    state = {"step": 3, "w": torch.arange(10.0)}
    for name, asynchronous in (("sync", False), ("async", True)):
        store = CheckpointDir(tmp_path / name, RetentionPolicy(), LOG, asynchronous=asynchronous)
        store.save(3, state, {"loss": 1.0})
        store.wait()
    assert (tmp_path / "sync" / "step_000003.pt").read_bytes() == (tmp_path / "async" / "step_000003.pt").read_bytes()


def test_a_nan_loss_ends_the_run_with_what_to_change_keeping_the_last_checkpoint(tmp_path):
    model = ModelConfig(n_layer=1, n_head=2, n_embd=32, context=16)
    config = PretrainConfig(steps=20, batch_size=4, lr=1e-2, checkpoint_every=5, log_every=5)

    def data(state):
        step, generator = (state.slot if state else 0), torch.Generator().manual_seed(0)
        while True:
            step += 1
            x, y = torch.randint(0, 16, (4, 16), generator=generator), torch.randint(0, 16, (4, 16), generator=generator)
            yield Batch(x=x, y=y, documents=(), state=LoaderState(slot=step), real_tokens=64, global_tokens=64)

    pretrain(data, 16, model, config.model_copy(update={"steps": 5}), 0, tmp_path, LOG)
    # A run that diverged: its last checkpoint holds weights gone to NaN (a valid file, with its checksum).
    store = CheckpointDir(tmp_path / CHECKPOINT_DIR, RetentionPolicy(), LOG)
    saved, state = store.latest()
    state["model"]["ln_f.weight"].fill_(float("nan"))
    store.save(saved.step, state, {"loss": 1.0})
    with pytest.raises(StageFailed, match=r"became nan at step 6; the last good checkpoint \(step_000005.pt\) is kept.*pretrain.lr"):
        pretrain(data, 16, model, config, 0, tmp_path, LOG)
    assert [c.step for c in store.complete()] == [5]
