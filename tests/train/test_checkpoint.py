"""What a checkpoint directory tells the stage's reporter: each checkpoint once complete, each deletion by retention."""

import json
import logging

import torch

from factory.train.checkpoint import CheckpointDir, RetentionPolicy
from factory.train.distributed import World
from factory.train.records import CheckpointEvent, checkpoint_message, read_checkpoint_message

LOG = logging.getLogger("test.checkpoint")


def test_each_save_is_told_after_its_record_and_each_deletion_after_the_bytes_are_gone(tmp_path):
    heard: list[tuple[str, int, bool, bool]] = []

    def on_event(event: CheckpointEvent) -> None:  # what is on disk when the message goes out
        path = event.checkpoint.path
        heard.append((event.event, event.checkpoint.step, path.exists(), path.with_suffix(".json").exists()))

    store = CheckpointDir(tmp_path, RetentionPolicy(keep_last=2, best_metric=None), LOG, on_event=on_event)
    for step in (1, 2, 3):
        store.save(step, {"step": step, "w": torch.full((4,), float(step))}, {"loss": 1.0 / step})
    assert heard == [("saved", 1, True, True), ("saved", 2, True, True), ("saved", 3, True, True), ("deleted", 1, False, False)]


def test_a_saved_message_carries_what_the_record_says(tmp_path):
    events: list[CheckpointEvent] = []
    store = CheckpointDir(tmp_path, RetentionPolicy(), LOG, asynchronous=True, on_event=events.append)
    store.save(7, {"step": 7, "w": torch.arange(3.0)}, {"loss": 2.5, "tokens_seen": 700.0})
    store.wait()
    record = json.loads((tmp_path / "step_000007.json").read_text())
    (saved,) = [event.checkpoint for event in events]
    assert (saved.step, saved.sha256, saved.size, saved.metrics) == (7, record["sha256"], record["size"], record["metrics"])
    assert saved.path == tmp_path / "step_000007.pt"


def test_only_rank_0_tells(tmp_path):
    events: list[CheckpointEvent] = []
    store = CheckpointDir(tmp_path, RetentionPolicy(), LOG, world=World(rank=1, size=2, local_rank=1), on_event=events.append)
    store.save(1, {"step": 1}, {"loss": 1.0})
    assert store.complete() and events == []


def test_a_checkpoint_message_reads_back_and_other_messages_are_not_checkpoints(tmp_path):
    events: list[CheckpointEvent] = []
    store = CheckpointDir(tmp_path, RetentionPolicy(keep_last=1, best_metric=None), LOG, on_event=events.append)
    for step in (1, 2):
        store.save(step, {"step": step}, {"loss": 1.0})
    messages = [json.loads(json.dumps(checkpoint_message(event))) for event in events]  # as they travel
    assert [read_checkpoint_message(message) for message in messages] == events
    assert [event.event for event in events] == ["saved", "saved", "deleted"]
    assert read_checkpoint_message({"step": 3, "loss": 1.0}) is None  # a metrics message
