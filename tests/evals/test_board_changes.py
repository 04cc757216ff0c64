"""The leaderboard after a change: the kept experiments' entries brought up to date with what changed in the registry
give the board computed from every manifest, whatever was published or removed (results of new benchmark versions,
other runs, shared training runs, models exported and removed, results that name another experiment)."""

import contextlib
import json
import logging
import math
import random
import sqlite3
import shutil
from pathlib import Path

import pytest

from factory.evals import publish
from factory.evals.publish import current_board
from factory.registry import ArtifactStore
from factory.registry.store import Provenance
from tests.conftest import publish_model, publish_result

EXPERIMENTS = ("a", "b", "c", "d")
BENCHMARKS = {"val_bpb": True, "heldout_bpb": True, "next_line": False}
TRAININGS = ("pretrain", "sft")


class History:
    """Random publications and removals in one registry, as runs, evaluations, promotions and a collector make them."""

    def __init__(self, registry: ArtifactStore, seed: int) -> None:
        self.registry, self.rng, self.count = registry, random.Random(seed), 0

    def publish(self, kind: str, fingerprint: str, experiment: str, summary: dict, inputs: dict | None = None, content: str = "",
                base: dict | None = None) -> None:
        with self.registry.staging() as out:
            (out / "bytes").write_text(content or fingerprint)
            self.registry.publish(out, kind=kind, fingerprint=fingerprint, config={}, inputs=inputs or {}, code="local:test", summary=summary,
                                  provenance=Provenance(experiment=experiment, config_hash="0" * 16, git_commit=f"{self.count:040x}",
                                                        base=base or {}))

    def training(self, experiment: str, stage: str) -> str:
        """A training run's fingerprint: an experiment's own of two, or one several experiments share."""
        return self.rng.choice([f"{stage}-{experiment}-1", f"{stage}-{experiment}-2", f"{stage}-shared"])

    def step(self) -> str:
        self.count += 1
        rng, experiment = self.rng, self.rng.choice(EXPERIMENTS)
        action = rng.choices(["result", "training", "model", "remove"], weights=[6, 2, 2, 2])[0]
        if action == "result":
            stage = rng.choice(TRAININGS)
            benchmark = rng.choice(list(BENCHMARKS))
            step = rng.choice([100, 200])
            data = rng.choice(["blend:1111111111111111+aaaaaaaa", f"own-split:{rng.choice('xy')}"])
            named = experiment if rng.random() > 0.05 else "elsewhere"  # a result whose summary names another experiment: skipped
            self.publish("evaluations", f"result-{self.count}", experiment, {
                "benchmark": benchmark, "version": rng.choice([1, 1, 1, 2]), "lower_is_better": BENCHMARKS[benchmark] ^ (rng.random() < 0.05),
                "value": round(rng.uniform(0, 3), 3) if rng.random() > 0.03 else math.nan, "count": 64, "data": data,
                "checkpoint": f"{named}__{stage}-{step:06d}",
                "experiment": named, "step": step, "tokens_seen": step * 10, "training": self.training(experiment, stage),
                **({"primary": rng.choice(list(BENCHMARKS))} if rng.random() < 0.3 else {})})
        elif action == "training":
            stage = rng.choice(TRAININGS)
            fingerprint = self.training(experiment, stage)
            base = {"from": "elsewhere", "model": f"{self.count:064x}"} if rng.random() < 0.2 else None
            self.publish(stage, fingerprint, experiment, {"steps": rng.choice([100, 200]), "tracker_url": f"http://tracker/{self.count}"},
                         content=rng.choice([fingerprint, "identical bytes"]), base=base)
        elif action == "model":
            trained = [m for stage in TRAININGS for m in self.registry.manifests(stage)]
            if trained:
                inputs = {m.kind: m.digest for m in rng.sample(trained, min(len(trained), rng.choice([1, 2])))}
                self.publish("model", f"model-{self.count}", experiment, {}, inputs=inputs)
        else:
            manifests = self.registry.manifest_paths()
            if manifests:
                rng.choice(manifests).unlink()
        return action


def from_scratch(registry: ArtifactStore, sort: str | None) -> dict:
    """The board computed from every manifest: nothing kept (the kept boards and entries set aside meanwhile)."""
    boards, aside = registry.root / "cache" / "boards", registry.root / "cache" / "aside"
    if boards.exists():
        boards.rename(aside)
    try:
        return current_board(registry, sort).to_json()
    finally:
        shutil.rmtree(boards, ignore_errors=True)
        if aside.exists():
            aside.rename(boards)


@pytest.mark.parametrize("seed", [1, 2])
def test_the_board_after_each_change_is_the_board_computed_from_every_manifest(tmp_path, seed, caplog):
    caplog.set_level(logging.DEBUG, logger="factory.evals.publish")
    registry = ArtifactStore(tmp_path)
    history = History(registry, seed)
    for _ in range(40):
        for _ in range(history.rng.choice([1, 1, 2, 3])):  # one change or a few between two boards
            history.step()
        sort = history.rng.choice([None, None, "val_bpb"])
        try:
            expected = from_scratch(registry, sort)
        except Exception as e:  # a sort benchmark without results: the same refusal either way
            with pytest.raises(type(e), match="no results for benchmark"):
                current_board(registry, sort)
            continue
        assert json.dumps(current_board(registry, sort).to_json()) == json.dumps(expected)  # (a score may be NaN)
    assert caplog.text.count("experiments' entries computed again") > 25  # most boards: the kept entries brought up to date


def test_a_kept_entry_that_is_damaged_is_computed_again(tmp_path, caplog):
    registry = ArtifactStore(tmp_path)
    history = History(registry, 7)
    while not current_board(registry).rows:
        history.step()
    [entries] = (tmp_path / "cache" / "boards").glob("entries-*.kept")
    state, kept = publish._kept(entries, None, list)
    kept[0]["row"] = {"experiment": "x"}  # a row lacking its fields
    publish._keep(entries, state, kept)
    history.publish("pretrain", "pretrain-new", "z", {"steps": 1})
    assert current_board(registry).to_json() == from_scratch(registry, None)
    assert "the kept leaderboard" in caplog.text and Path(entries).exists()
    caplog.clear()
    entries.write_bytes(entries.read_bytes()[:-1] + b"\x00")  # its last byte changed: marshal is never given it
    history.publish("pretrain", "pretrain-newer", "z", {"steps": 1})
    assert current_board(registry).to_json() == from_scratch(registry, None)
    assert "is not what its sha256 says" in caplog.text


def damage(registry: ArtifactStore, where: str, kind: str = "kind = 'evaluations'", body: str = "'not json'") -> None:
    """Rows of the registry's index (of evaluation results) whose manifest (JSON) is no longer JSON, or is `body`."""
    with contextlib.closing(sqlite3.connect(registry.index().path)) as db, db:
        assert db.execute(f"UPDATE manifests SET body = {body} WHERE {kind} AND {where}").rowcount


@pytest.mark.parametrize("damaged", ["a row that came in since the kept board", "an older row of an experiment a change touches",
                                     "a row whose inputs are not digests"])
def test_a_damaged_row_of_the_index_is_read_again_from_the_manifests(tmp_path, damaged):
    registry = ArtifactStore(tmp_path)
    for name in ("x", "y"):
        publish_result(registry, name, "val_bpb", 2.0 if name == "x" else 1.0, step=100, training=f"run-{name}")
        publish_model(registry, name, step=100, training=f"run-{name}")
    assert [row.experiment for row in current_board(registry).rows] == ["y", "x"]
    if damaged.startswith("a row that came in"):
        publish_result(registry, "x", "val_bpb", 0.5, step=200, training="run-x")
        registry.index().state()
        damage(registry, "generation = (SELECT MAX(generation) FROM manifests)")
    elif damaged.startswith("a row whose inputs"):
        publish_model(registry, "x", step=200, training="run-x2")
        registry.index().state()
        damage(registry, "1", "kind = 'model' AND generation = (SELECT MAX(generation) FROM manifests)",
               "json_set(body, '$.inputs.pretrain', json('[1]'))")
    else:
        damage(registry, "experiment = 'x'")
        publish_result(registry, "x", "val_bpb", 0.5, step=200, training="run-x")
    board = current_board(registry)
    assert [row.experiment for row in board.rows] == ["y", "x"] and board.to_json() == from_scratch(registry, None)
