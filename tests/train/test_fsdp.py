"""FSDP2 on two CPU ranks (gloo): the same training as DDP and one rank, shards of about 1/N each, checkpoints that reshard
between world sizes and between FSDP and DDP, `compile: true` (inductor compiles the sharded blocks, with the machine's
C++ compiler) training as the uncompiled run does, and clear errors for what cannot be split or resumed."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import torch

from factory.config.schema import PretrainConfig
from factory.errors import ConfigError
from factory.train.checkpoint import checkpoint_digest, load_checkpoint
from factory.train.pretrain import CHECKPOINT_DIR, METRICS_FILE, pretrain
from tests.train.test_pretrain import LOG, MODEL, TRAIN, VOCAB, source
from tests.train.conftest import REPO, ended, finish, launch

pytestmark = pytest.mark.slow  # two-rank worlds under torchrun

# Resumes the latest checkpoint of each work directory it is given into a model of the parallelism given with it, as a
# training run does, and saves what it holds again, unchanged, into another directory; each rank notes the bytes it read
# verifying and loading. One world restores its checkpoints one after the other (a world of torchrun ranks costs seconds to
# start); the first restore of a process is the one whose reads come before any other's.
RESAVER = textwrap.dedent(
    """
    import json, logging, os, sys
    from pathlib import Path
    from factory.config.schema import ModelConfig, PretrainConfig
    from factory.data.loader import LoaderState
    from factory.train.checkpoint import CheckpointDir, RetentionPolicy, checkpoint_digest
    from factory.train.distributed import join, leave, world_from_env
    from factory.train.parallel import build_for_training
    from factory.train.pretrain import _state, build_optimizer
    from factory.train.resume import resume

    def read() -> int:  # bytes this process has read through read(2) so far
        return int(dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())["rchar"])

    world = world_from_env()
    join(world)
    log = logging.getLogger("resaver")
    for source, target, parallelism in json.loads(sys.argv[1]):
        source, target = Path(source), Path(target)
        model_config = ModelConfig(n_layer=2, n_head=2, n_embd=64, context=32, dropout=0.1)
        config = PretrainConfig(steps=60, batch_size=8, lr=3e-3, checkpoint_format="sharded", parallelism=parallelism)
        model = build_for_training(model_config, 64, 99, config, world)  # other initial weights: everything must come from the checkpoint
        optimizer = build_optimizer(model, config)
        checkpoints = CheckpointDir(source, RetentionPolicy(), log, sharded=True, world=world)
        before = read()
        checkpoint_digest(checkpoints.complete()[-1].path, world)
        verified = read()
        saved, state = resume(checkpoints, model, optimizer, world, log)
        loaded = read()
        again = _state(model, optimizer, state["step"], LoaderState.from_json(state["data_position"]), state["tokens_seen"], world, None)
        CheckpointDir(target, RetentionPolicy(), log, sharded=True, world=world).save(saved.step, again, {"loss": 1.0})
        reads = {"verify": verified - before, "load": loaded - verified - (verified - before)}
        (target.parent / f"read-{world.rank}.json").write_text(json.dumps(reads))
    leave(world)
    os._exit(0)  # as a stage's ranks end (`exit_now`): a thread torch leaves joinable can abort the interpreter's exit
    """
)
RESAVES = [("fsdp2", 2, "fsdp"), ("fsdp2", 1, "ddp"), ("fsdp2", 1, "fsdp"), ("one", 2, "fsdp"), ("ddp2", 2, "fsdp")]
"""(written by, ranks, parallelism): the final checkpoint of a run of `runs` restored on that many ranks under that
parallelism: the same world (fsdp2 on 2), 2 -> 1 (FSDP -> DDP, and under FSDP), 1 -> 2 (DDP -> FSDP), DDP -> FSDP on the
same world. Each world size's first is fsdp2's, whose reads test_each_fsdp_rank_reads_about_its_share_of_a_sharded_checkpoint
compares."""


def resave(jobs: list[tuple[Path, Path, str]], ranks: int) -> None:
    """On one world of `ranks` ranks, for each (source, target, parallelism) in turn: restore `source`'s latest checkpoint
    under `parallelism` and save what the ranks hold into `target`; each rank's reads go to `target`'s parent."""
    script = jobs[0][1].parent.parent / f"resaver-{ranks}.py"
    script.write_text(RESAVER)
    prefix = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    argument = json.dumps([[str(source), str(target), parallelism] for source, target, parallelism in jobs])
    done = subprocess.run([*prefix, str(script), argument], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def losses(work: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (work / METRICS_FILE).read_text().splitlines()]


def assert_same_state(ours: dict, theirs: dict) -> None:
    """Every model tensor and optimizer slot equal, bit for bit; the same step and data position."""
    assert ours["step"] == theirs["step"] and ours["data_position"] == theirs["data_position"]
    assert ours["model"].keys() == theirs["model"].keys()
    for name, tensor in theirs["model"].items():
        assert torch.equal(ours["model"][name], tensor), name
    assert ours["optimizer"]["state"].keys() == theirs["optimizer"]["state"].keys()
    for index, slots in theirs["optimizer"]["state"].items():
        for key, value in slots.items():
            assert torch.equal(ours["optimizer"]["state"][index][key], value), (index, key)
    assert ours["optimizer"]["param_groups"] == theirs["optimizer"]["param_groups"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, warm) -> dict[str, Path]:
    """The same 8 steps (global batch 8, checkpoints at 4 and 8) on 2 ranks of FSDP, 2 of DDP and 1 rank."""
    works = {}
    recompute = {"activation_checkpointing": "full", "reshard_after_forward": False}
    for name, ranks, parallelism, extra in (
        ("fsdp2", 2, "fsdp", {}), ("ddp2", 2, "ddp", {}), ("one", 1, "ddp", {}), ("fsdp2-recompute", 2, "fsdp", recompute),
    ):
        work = tmp_path_factory.mktemp(name) / "work"
        finish(launch(work, steps=8, every=4, ranks=ranks, dropout=0.0, sharded=True, parallelism=parallelism, extra=extra, warm=warm))
        works[name] = work
    return works


def test_fsdp_on_two_ranks_follows_the_loss_curve_of_ddp_and_of_one_rank(runs):
    fsdp, ddp, one = (losses(runs[name]) for name in ("fsdp2", "ddp2", "one"))
    assert len(fsdp) == 8
    torch.testing.assert_close(torch.tensor(fsdp), torch.tensor(ddp), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(fsdp), torch.tensor(one), rtol=1e-5, atol=1e-6)
    assert fsdp[-1] < fsdp[0], "it learns"
    a, b = (load_checkpoint(runs[name] / CHECKPOINT_DIR / "step_000008") for name in ("fsdp2", "one"))
    for name, weight in b["model"].items():
        torch.testing.assert_close(a["model"][name], weight, rtol=1e-3, atol=1e-4)  # float noise, amplified by Adam


@pytest.fixture(scope="module")
def resaved(runs, tmp_path_factory) -> dict[tuple[str, int, str], Path]:
    """Each of RESAVES restored and saved again: {(written by, ranks, parallelism): the directory it was saved into}; one
    world per world size."""
    out = tmp_path_factory.mktemp("resaved")
    targets = {case: out / "-".join(map(str, case)) / "again" for case in RESAVES}
    for ranks in (1, 2):
        resave([(runs[by] / CHECKPOINT_DIR, targets[(by, on, parallelism)], parallelism) for by, on, parallelism in RESAVES if on == ranks], ranks)
    return targets


def test_recomputed_activations_and_unsharded_backward_give_the_same_fsdp_weights(runs):
    ours, theirs = (load_checkpoint(runs[name] / CHECKPOINT_DIR / "step_000008") for name in ("fsdp2-recompute", "fsdp2"))
    assert all(torch.equal(ours["model"][name], weight) for name, weight in theirs["model"].items())


@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="inductor compiles C++ on the CPU")
def test_a_compiled_fsdp_run_follows_the_uncompiled_one(runs, tmp_path, warm):
    work = tmp_path / "work"  # inductor's first compile: about 25 s on 2 cores
    finish(launch(work, steps=8, every=4, ranks=2, dropout=0.0, sharded=True, parallelism="fsdp", extra={"compile": True}, warm=warm))
    eager, compiled = losses(runs["fsdp2"]), losses(work)
    assert len(compiled) == 8 and compiled[-1] < compiled[0], "it learns"
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=1e-5, atol=1e-5)  # fused kernels round otherwise
    ours, theirs = (load_checkpoint(w / CHECKPOINT_DIR / "step_000008") for w in (work, runs["fsdp2"]))
    for name, weight in theirs["model"].items():
        torch.testing.assert_close(ours["model"][name], weight, rtol=1e-3, atol=1e-4)  # float noise, amplified by Adam


def test_each_fsdp_rank_writes_about_half_of_the_state(runs):
    final = runs["fsdp2"] / CHECKPOINT_DIR / "step_000008"
    shards = {p.name: p.stat().st_size for p in final.iterdir()}
    assert set(shards) == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    data = shards["__0_0.distcp"] + shards["__1_0.distcp"]
    assert all(0.35 < shards[f"__{rank}_0.distcp"] / data < 0.65 for rank in (0, 1)), shards
    state = load_checkpoint(final)
    tensors = [*state["model"].values(), *(v for slots in state["optimizer"]["state"].values() for v in slots.values())]
    assert data >= sum(t.numel() * t.element_size() for t in tensors) * 0.9, "the shards hold the whole state between them"


@pytest.mark.parametrize(("written_by", "ranks", "parallelism"), RESAVES)
def test_a_checkpoint_restores_identically_on_another_world_size_and_parallelism(runs, resaved, written_by, ranks, parallelism):
    again = resaved[(written_by, ranks, parallelism)]
    ours, theirs = load_checkpoint(again / "step_000008"), load_checkpoint(runs[written_by] / CHECKPOINT_DIR / "step_000008")
    assert_same_state(ours, theirs)
    assert len(ours["rng"]) == ranks


def test_each_fsdp_rank_reads_about_its_share_of_a_sharded_checkpoint(runs, resaved):
    alone = json.loads((resaved[("fsdp2", 1, "ddp")].parent / "read-0.json").read_text())
    reads = [json.loads((resaved[("fsdp2", 2, "fsdp")].parent / f"read-{rank}.json").read_text()) for rank in (0, 1)]
    size = checkpoint_digest(runs["fsdp2"] / CHECKPOINT_DIR / "step_000008")[1]
    assert alone["verify"] >= size, "one rank hashes every file"
    for read in reads:  # each rank hashes about half the files and loads its own shards (every rank reads the metadata)
        assert 0.3 * size < read["verify"] < 0.7 * size, (size, reads)
        assert read["load"] < 0.65 * alone["load"], (alone, reads)


@pytest.mark.parametrize(("written_by", "ranks", "parallelism"), [("fsdp2", 1, "ddp"), ("one", 2, "fsdp")])
def test_a_resharded_resume_continues_the_same_training(runs, tmp_path, written_by, ranks, parallelism, warm):
    work = tmp_path / "work"
    shutil.copytree(runs[written_by], work)
    for leftover in ("step_000008", "step_000008.json"):  # as if stopped after step 4's checkpoint
        path = work / CHECKPOINT_DIR / leftover
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    err = finish(launch(work, steps=8, every=4, ranks=ranks, dropout=0.0, sharded=True, parallelism=parallelism, warm=warm))
    assert "resuming from step_000004" in err and "reseeded" in err
    ours, theirs = load_checkpoint(work / CHECKPOINT_DIR / "step_000008"), load_checkpoint(runs[written_by] / CHECKPOINT_DIR / "step_000008")
    assert ours["data_position"] == theirs["data_position"] and ours["tokens_seen"] == theirs["tokens_seen"]
    torch.testing.assert_close(torch.tensor(losses(work)), torch.tensor(losses(runs[written_by])), rtol=1e-5, atol=1e-6)
    for name, weight in theirs["model"].items():
        torch.testing.assert_close(ours["model"][name], weight, rtol=1e-3, atol=1e-4)


def test_a_rank_killed_in_a_sharded_save_leaves_no_checkpoint_that_looks_complete(tmp_path, warm):
    work = tmp_path / "work"
    process = launch(work, steps=20, every=1, ranks=2, dropout=0.0, parallelism="fsdp", warm=warm)
    checkpoints, deadline = work / CHECKPOINT_DIR, time.monotonic() + 120

    def saving() -> bool:  # shards of a save being written, after a few saves completed
        names = list(checkpoints.iterdir()) if (checkpoints / "step_000005.json").exists() else []
        return any(p.suffix == ".tmp" and p.is_dir() for p in names)

    while process.poll() is None and not saving():
        assert time.monotonic() < deadline
        time.sleep(0.0002)
    psutil.Process(int((tmp_path / "rank-1.pid").read_text())).kill()  # the rank that does not rename the shards into place
    assert ended(process)[0] != 0, "torchrun ends the job when a rank dies"
    records = sorted(checkpoints.glob("*.json"))
    assert records and any(p.suffix == ".tmp" for p in checkpoints.iterdir()), "the kill landed in a save"
    for record in records:  # whatever has a record is whole: its bytes match and load
        sha256 = json.loads(record.read_text())["sha256"]
        assert checkpoint_digest(record.with_suffix(""))[0] == sha256
        assert load_checkpoint(record.with_suffix(""), sha256)["step"] == int(record.stem.removeprefix("step_"))
    err = finish(launch(work, steps=20, every=1, ranks=2, dropout=0.0, parallelism="fsdp", warm=warm))
    assert f"resuming from {records[-1].stem}" in err and "left by an interrupted save" in err
    assert load_checkpoint(checkpoints / "step_000020")["step"] == 20 and not list(checkpoints.glob("*.tmp"))


def test_a_resume_into_another_model_shape_names_the_checkpoint_and_what_to_change(tmp_path):
    config = TRAIN.model_copy(update={"checkpoint_format": "sharded", "steps": 10})
    pretrain(source(), VOCAB, MODEL, config, 0, tmp_path, LOG)
    wider = MODEL.model_copy(update={"n_embd": MODEL.n_embd * 2})
    with pytest.raises(ConfigError, match=r"checkpoint .*step_000010 holds a model of another shape .*restore the model section"):
        pretrain(source(), VOCAB, wider, config.model_copy(update={"steps": 20}), 0, tmp_path, LOG)


def test_configs_that_cannot_be_split_are_refused_before_any_step():
    with pytest.raises(ValueError, match="checkpoint_format: sharded"):
        PretrainConfig(steps=5, parallelism="fsdp")
    with pytest.raises(ValueError, match="fsdp only"):
        PretrainConfig(steps=5, reshard_after_forward=False)
    from factory.train.distributed import World
    from factory.train.parallel import blocks_of, check_split

    with pytest.raises(ConfigError, match=r"pretrain.batch_size \(8\) must be divisible by the number of ranks \(3\)"):
        check_split(PretrainConfig(steps=5, batch_size=8), World(rank=0, size=3))
    with pytest.raises(ConfigError, match=r"grad_accum_steps \(4\) does not divide"):
        check_split(PretrainConfig(steps=5, batch_size=8, grad_accum_steps=4), World(rank=0, size=4))
    with pytest.raises(ConfigError, match=r"fsdp works block by block, but architecture 'tiny' has no `blocks` \(or `layers`\) list .*use parallelism: ddp"):
        blocks_of(torch.nn.Linear(4, 4), "tiny")


def test_the_default_parallelism_is_left_out_of_the_dump_and_fsdp_is_in_it():
    ddp = PretrainConfig(steps=5).model_dump()
    assert "parallelism" not in ddp and "reshard_after_forward" not in ddp
    fsdp = PretrainConfig(steps=5, parallelism="fsdp", checkpoint_format="sharded").model_dump()
    assert fsdp["parallelism"] == "fsdp" and "reshard_after_forward" not in fsdp
