"""Activation checkpointing: blocks that recompute their activations in the backward train the same bytes (dropout
included), and a model without blocks is refused with what to change."""

import hashlib
import json

import pytest
import torch

from factory.config.schema import PretrainConfig
from factory.errors import ConfigError
from factory.models.build import build_model
from factory.train.parallel import recompute_blocks
from factory.train.pretrain import CHECKPOINT_DIR, METRICS_FILE, pretrain
from tests.train.test_pretrain import LOG, MODEL, TRAIN, VOCAB, source

DEEP = MODEL.model_copy(update={"n_layer": 3, "dropout": 0.1})  # dropout: the recomputation must replay its masks


def final_sha(work) -> str:
    return hashlib.sha256((work / CHECKPOINT_DIR / "step_000010.pt").read_bytes()).hexdigest()


def test_full_and_selective_recomputation_train_the_bytes_of_none_with_the_memory_they_save_measured(tmp_path):
    shas, rows = {}, {}
    for mode in ("none", "full", "selective"):
        config = TRAIN.model_copy(update={"steps": 10, "checkpoint_every": 0, "activation_checkpointing": mode})
        pretrain(source(), VOCAB, DEEP, config, 0, tmp_path / mode, LOG)
        shas[mode] = final_sha(tmp_path / mode)
        rows[mode] = [json.loads(line) for line in (tmp_path / mode / METRICS_FILE).read_text().splitlines()]
    assert shas["full"] == shas["none"] and shas["selective"] == shas["none"]
    kept = {mode: rows[mode][0]["activations_mb"] for mode in rows}
    saved = {mode: rows[mode][0]["activations_saved_mb"] for mode in rows}
    assert kept["full"] < kept["selective"] < kept["none"], kept  # selective recomputes blocks 0 and 2 of 3
    assert saved["none"] == 0 and saved["full"] > saved["selective"] > 0, saved
    for mode in rows:  # what is kept plus what recomputation saves is what keeping everything takes
        assert kept[mode] + saved[mode] == pytest.approx(kept["none"], abs=0.002)
        assert all(row["activations_mb"] == kept[mode] for row in rows[mode]), "measured once, reported in every row"


def test_the_blocks_recomputed_are_those_asked_for():
    model = build_model(DEEP, VOCAB, 0)
    assert recompute_blocks(model, PretrainConfig(steps=5), DEEP.arch) == 0
    assert recompute_blocks(model, PretrainConfig(steps=5, activation_checkpointing="full"), DEEP.arch) == 3
    model = build_model(DEEP, VOCAB, 0)
    selective = PretrainConfig(steps=5, activation_checkpointing="selective", activation_checkpoint_every=2)
    assert recompute_blocks(model, selective, DEEP.arch) == 2  # blocks 0 and 2
    assert "forward" in vars(model.blocks[0]) and "forward" not in vars(model.blocks[1])
    model(torch.zeros((2, DEEP.context), dtype=torch.int64)).sum().backward()
    assert model.blocks[1].attn.qkv.weight.grad is not None


def test_what_cannot_be_recomputed_is_refused_with_what_to_change():
    with pytest.raises(ConfigError, match=r"activation_checkpointing works block by block.*set activation_checkpointing: none"):
        recompute_blocks(torch.nn.Linear(4, 4), PretrainConfig(steps=5, activation_checkpointing="full"), "tiny")
    with pytest.raises(ValueError, match="selective only"):
        PretrainConfig(steps=5, activation_checkpoint_every=3)
    assert "activation_checkpointing" not in PretrainConfig(steps=5).model_dump()
