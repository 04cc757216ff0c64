"""Sharded checkpoints (torch.distributed.checkpoint) in one process: same training, a directory with a digest, damage
skipped, leftovers of a killed save removed, retention by directory. Two ranks and SIGKILL: tests/train/test_resume.py."""

import logging
import shutil

import pytest
import torch

from factory.train.checkpoint import CheckpointDir, RetentionPolicy, checkpoint_digest, load_checkpoint, published
from factory.train.pretrain import CHECKPOINT_DIR, load_weights, pretrain
from tests.train.test_pretrain import LLAMA, MODEL, TRAIN, VOCAB, source

LOG = logging.getLogger("test.sharded")
SHARDED = TRAIN.model_copy(update={"checkpoint_format": "sharded"})


def state(step: int) -> dict:
    return {"step": step, "model": {"w": torch.full((64,), float(step))}, "data_position": {"slot": step}, "rng": [{"torch": torch.random.get_rng_state()}]}


def test_the_sharded_format_trains_the_same_weights_and_records_a_directory_digest(tmp_path):
    pretrain(source(), VOCAB, MODEL, TRAIN, 0, tmp_path / "file", LOG)
    result = pretrain(source(), VOCAB, MODEL, SHARDED, 0, tmp_path / "sharded", LOG)
    assert result.checkpoints[-1] == "step_000030"
    saved = published(tmp_path / "sharded" / CHECKPOINT_DIR)
    assert [c.step for c in saved] == [10, 20, 30] and all(c.path.is_dir() for c in saved)
    assert (saved[-1].sha256, saved[-1].size) == checkpoint_digest(saved[-1].path)
    assert result.checkpoint_bytes == sum(c.size for c in saved)
    ours, theirs = load_weights(saved[-1].path), load_weights(tmp_path / "file" / CHECKPOINT_DIR / "step_000030.pt")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[name], theirs[name]) for name in theirs)
    full = load_checkpoint(saved[-1].path, saved[-1].sha256)
    assert full["step"] == 30 and full["data_position"]["slot"] == 30
    assert all(isinstance(index, int) for index in full["optimizer"]["state"]), "the optimizer's state is keyed as torch keys it"


@pytest.mark.parametrize("model", [MODEL, LLAMA], ids=["gpt", "llama"])
def test_a_resumed_sharded_run_continues_from_its_last_checkpoint(tmp_path, model):
    pretrain(source(), VOCAB, model, SHARDED, 0, tmp_path / "whole", LOG)
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")
    shutil.rmtree(tmp_path / "cut" / CHECKPOINT_DIR / "step_000030")  # as if killed after step 20's save
    (tmp_path / "cut" / CHECKPOINT_DIR / "step_000030.json").unlink()
    resumed = pretrain(source(), VOCAB, model, SHARDED, 0, tmp_path / "cut", LOG)
    assert resumed.resumed_from == 20 and resumed.steps_computed == 10
    ours, theirs = (load_weights(tmp_path / run / CHECKPOINT_DIR / "step_000030") for run in ("cut", "whole"))
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)


def test_a_damaged_shard_is_skipped_for_the_previous_checkpoint(tmp_path, caplog):
    store = CheckpointDir(tmp_path, RetentionPolicy(keep_last=3), LOG, sharded=True)
    for step in (1, 2):
        store.save(step, state(step), {"loss": 1.0})
    shard = tmp_path / "step_000002" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        found, loaded = store.latest()
    assert found.step == 1 and torch.equal(loaded["model"]["w"], torch.full((64,), 1.0))
    assert "step_000002 does not match its checksum" in caplog.text


def test_what_a_killed_sharded_save_left_is_removed_and_retention_deletes_directories(tmp_path, caplog):
    store = CheckpointDir(tmp_path, RetentionPolicy(keep_last=1, best_metric=None), LOG, sharded=True)
    store.save(1, state(1), {"loss": 1.0})
    (tmp_path / "step_000002.tmp").mkdir()  # shards still being written
    (tmp_path / "step_000002.tmp" / "__0_0.distcp").write_bytes(b"partial")
    (tmp_path / "step_000003").mkdir()  # renamed into place, killed before its record
    (tmp_path / "step_000003" / ".metadata").write_bytes(b"torn")
    with caplog.at_level(logging.INFO, logger=LOG.name):
        store.drop_incomplete()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000001", "step_000001.json"]
        store.save(4, state(4), {"loss": 1.0})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000004", "step_000004.json"]
    assert "deleted checkpoint step_000001 by policy" in caplog.text and "left by an interrupted save" in caplog.text


def test_a_resume_skips_a_sharded_checkpoint_whose_bytes_changed_for_the_one_before(tmp_path, caplog):
    pretrain(source(), VOCAB, MODEL, SHARDED, 0, tmp_path / "whole", LOG)
    shard = tmp_path / "whole" / CHECKPOINT_DIR / "step_000030" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))
    with caplog.at_level(logging.INFO, logger=LOG.name):
        resumed = pretrain(source(), VOCAB, MODEL, SHARDED, 0, tmp_path / "whole", LOG)
    assert "step_000030 does not match its checksum" in caplog.text and "resuming from step_000020" in caplog.text
    assert resumed.resumed_from == 20 and resumed.steps_computed == 10
