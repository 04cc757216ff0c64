"""The pretrain stage as the Dagster asset launches it (a request file, `stage_argv`, the local launcher forking it from a
warm interpreter; torchrun's agent for several ranks, forking them too): killed on two ranks, it resumes on one on
another machine from the checkpoints in the object store, since placement is no part of its fingerprint, and trains on
the same global batches as a run never killed."""

import contextlib
import json
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from factory.config import load, plan_stage
from factory.config.stages import placement
from factory.data.catalog import CatalogConfig
from factory.devices import describe, device_for
from factory.errors import StageFailed
from factory.launch import LocalLauncher, stage_argv
from factory.launch.local import warm_starts
from factory.launch.warm import SERVER_MODULE
from factory.registry.layout import METRICS_FILE, POSITIONS_FILE
from factory.registry import open_registry
from factory.registry.store import ArtifactStore, Provenance
from factory.runtime import warm_modules
from factory.runtime.request import StageRequest
from tests.stages.conftest import run_stages
from tests.s3server import running_s3
from tests.stages.test_runners import SOURCES

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_pipes")]  # three stage processes, one of two ranks
STEPS, EVERY = 100, 20
TRAINING = {
    "model": {"n_layer": 1, "n_head": 2, "n_embd": 32, "context": 32},
    "pretrain": {"steps": STEPS, "batch_size": 8, "lr": 3e-3, "warmup_steps": 5, "checkpoint_every": EVERY, "keep_last": 2,
                 "log_every": 1, "checkpoint_format": "sharded", "parallelism": "fsdp"},
}
ENV = {"FACTORY_TRACKER": "none", "OMP_NUM_THREADS": "1"}


def pretrain_request(experiment, digests: dict[str, str], registry: ArtifactStore, catalog: Path, path: Path) -> Path:
    """The request the `pretrain` asset writes for `experiment`: its spec and the ranks its resources place it on."""
    where = placement(experiment, "pretrain")
    request = StageRequest(spec=plan_stage(experiment, "pretrain", digests), registry=str(registry.root), catalog=CatalogConfig.local(catalog),
                           provenance=Provenance(experiment=experiment.name, config_hash="0" * 16, git_commit="test"),
                           processes=where.processes, nodes=where.nodes, placement=dict(where.roles), gpus=where.gpus)
    return request.write(path)


def launch(request_path: Path, env: dict[str, str] = ENV) -> None:
    """Run the stage as the asset's launcher does in a run (forked from a warm interpreter; torchrun's agent when the
    request asks for several ranks), `env` set for it. The interpreter is kept for the next launch in the same environment."""
    request = StageRequest.read(request_path)
    with warm_starts(warm_modules(["pretrain"], ENV["FACTORY_TRACKER"])):
        LocalLauncher().run(stage_argv(request_path, processes=request.processes, nodes=request.nodes), env, "pretrain")


def launch_failing(request_path: Path, failures: list[BaseException], env: dict[str, str] = ENV) -> None:
    """`launch`, keeping the failure the launcher reports for a killed stage (a stage that ends well keeps none)."""
    try:
        launch(request_path, env)
    except StageFailed as e:
        failures.append(e)


def logged_step(work: Path) -> int:
    try:
        lines = (work / METRICS_FILE).read_text().splitlines()
        return json.loads(lines[-1])["step"] if lines else 0
    except (OSError, ValueError, KeyError, IndexError):
        return 0


def kill_stage_after(work: Path, step: int, failures: list[BaseException], thread: threading.Thread) -> int:
    """SIGKILL the stage (torchrun's agent) and its ranks, as a lost machine would, once the stage logged `step`; the step
    it had logged."""
    deadline = time.monotonic() + 180
    while logged_step(work) < step and thread.is_alive():
        assert time.monotonic() < deadline, "the stage never reached the step"
        time.sleep(0.002)
    stage = [p for p in psutil.Process().children(recursive=True) if forked_by_warm_interpreter(p)]
    assert stage, f"no stage process to kill (it failed: {failures})"
    processes = {*stage, *(child for p in stage for child in p.children(recursive=True))}
    # All stopped first, as a lost machine stops at once: none sees another die (a rank whose agent died before it would
    # be told to stop, and would say where it stopped).
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.suspend()
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    thread.join(timeout=120)
    return logged_step(work)


def forked_by_warm_interpreter(process: psutil.Process) -> bool:
    """Whether `process` was forked from the warm interpreter (the stage: here torchrun's agent, whose ranks and the
    processes that wait for them are its children): its parent runs the interpreter's module."""
    with contextlib.suppress(psutil.Error):
        parent = process.parent()
        return parent is not None and parent.cmdline()[1:3] == ["-m", SERVER_MODULE]
    return False


def upstream_and_placements(tmp_path: Path, tiny_path: Path) -> tuple[dict[str, str], Any, Any]:
    """The stages up to the tokenizer, run into `tmp_path/registry`: their digests, and the tiny experiment training on
    two ranks and on one."""
    source = tmp_path / "src"
    data = {"datasets": {"code": {"source": {"kind": "directory", "path": str(source)}}},
            "blend": [{"dataset": "code", "weight": 1, "mode": "oversample"}], "validation_percent": 10}
    artifacts = run_stages(tmp_path, tiny_path, SOURCES, "src", "tokenizer", tokenizer={"vocab_size": 300}, data=data,
                           resources={"processes_per_node": 2}, **TRAINING)
    tiny = load(tiny_path)
    sections = {name: getattr(tiny, name).model_validate(value) for name, value in {**TRAINING, "tokenizer": {"vocab_size": 300}}.items()}
    two = tiny.model_copy(update={"data": tiny.data.model_validate(data), "resources": tiny.resources.model_validate({"processes_per_node": 2}),
                                  **sections})
    one = two.model_copy(update={"resources": two.resources.model_validate({"processes_per_node": 1})})
    return {kind: path.name for kind, path in artifacts.items()}, two, one


def test_a_stage_killed_on_two_ranks_on_one_machine_resumes_on_one_rank_on_another_from_the_object_store(tmp_path, tiny_path, capsys, monkeypatch):
    """With the registry in S3 (moto's server), the sharded checkpoints two ranks saved are in the bucket; a relaunch on
    one rank in a machine that never saw the work directory resumes from them (reseeded for its world size; asking for a
    GPU this machine lacks, said once, it runs on the CPU) and ends as a run never killed does: the same global batches."""
    digests, two, one = upstream_and_placements(tmp_path, tiny_path)
    local = ArtifactStore(tmp_path / "registry")
    assert plan_stage(one, "pretrain", digests).fingerprint == plan_stage(two, "pretrain", digests).fingerprint, "placement is not in it"
    fingerprint = plan_stage(two, "pretrain", digests).fingerprint

    with running_s3(relay=False) as server:
        for name, value in {**server.env(), "FACTORY_STORE": server.url}.items():
            monkeypatch.setenv(name, value)
        machine_a, machine_b = open_registry(tmp_path / "machine-a"), open_registry(tmp_path / "machine-b")
        for m in local.manifests():  # the upstream artifacts, published to the bucket
            machine_a.publish(local.path(m.digest), kind=m.kind, fingerprint=m.fingerprint, config=m.config, inputs=m.inputs,
                              code=m.code, provenance=Provenance(experiment=m.experiment, config_hash=m.config_hash,
                                                                  git_commit=m.git_commit), summary=m.summary)
        failures: list[BaseException] = []
        on_two = pretrain_request(two, digests, machine_a, tmp_path / "catalog", tmp_path / "two.json")
        assert StageRequest.read(on_two).processes == 2
        temporary = tmp_path / "tmp"  # the stage's TMPDIR: its ranks, killed, leave nothing there
        temporary.mkdir()
        thread = threading.Thread(target=launch_failing, daemon=True, args=(on_two, failures, {**ENV, "TMPDIR": str(temporary)}))
        thread.start()
        killed_at = kill_stage_after(machine_a.work_path(fingerprint), EVERY + 5, failures, thread)
        assert EVERY + 5 <= killed_at < STEPS, "the kill must land after a checkpoint and before the end"
        assert failures and "exited with code" in str(failures[0]), failures
        assert machine_a.lookup(fingerprint) is None, "a killed stage publishes nothing"
        left = [p.name for p in temporary.iterdir() if p.name.startswith(("rank-", "torchelastic_"))]  # torch's caches aside
        assert left == [], "a killed rank's temporary files were in the stage's scratch, which went with it"
        saved = machine_a.store.list(f"work/{fingerprint}/checkpoints/")
        assert any(key.endswith(f"step_{EVERY:06d}.json") for key in saved), saved
        assert not machine_b.work_path(fingerprint).exists()
        capsys.readouterr()

        on_a_gpu = one.model_copy(update={"resources": one.resources.model_copy(update={"gpus": 1})})
        launch(pretrain_request(on_a_gpu, digests, machine_b, tmp_path / "catalog", tmp_path / "one.json"))
        err = capsys.readouterr().err
        warned = err.count("resources.gpus asks for 1 GPU(s), but this machine has none: the stage runs on the CPU")
        assert warned == (0 if torch.cuda.is_available() else 1), err[-3000:]
        resumed = (killed_at // EVERY) * EVERY
        assert f"resuming from step_{resumed:06d}" in err or f"resuming from step_{resumed - EVERY:06d}" in err, err[-3000:]
        assert "written by 2 rank(s), this run has 1" in err and "reseeded" in err
        manifest = machine_b.lookup(fingerprint)
        assert manifest.summary["ranks"] == 1 and manifest.summary["steps"] == STEPS and manifest.summary["resumed_from_step"] >= EVERY
        assert manifest.summary["device"] == describe(device_for(1)), "the stage records where it computed: the CPU here"
        assert machine_b.store.list(f"work/{fingerprint}/") == []  # published: the scratch is gone from the bucket too
        ours = machine_b.open(manifest.digest)

    monkeypatch.delenv("FACTORY_STORE")
    launch(pretrain_request(one, digests, local, tmp_path / "catalog", tmp_path / "reference.json"))  # never killed, on disk
    reference = local.lookup(fingerprint)
    theirs = local.path(reference.digest)
    assert manifest.summary["tokens_seen"] == reference.summary["tokens_seen"], "the same global batches, whatever the ranks"
    assert (ours / POSITIONS_FILE).read_text() == (theirs / POSITIONS_FILE).read_text(), "the loader went through the same positions"
    losses = [[json.loads(line)["loss"] for line in (where / METRICS_FILE).read_text().splitlines()] for where in (ours, theirs)]
    assert len(losses[0]) == STEPS
    torch.testing.assert_close(torch.tensor(losses[0]), torch.tensor(losses[1]), rtol=1e-4, atol=1e-5)
