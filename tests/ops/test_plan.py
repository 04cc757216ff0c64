"""Plan reasons: which input changed since this experiment last produced a stage."""

from factory.config import load, plan_stage
from factory.registry import ArtifactStore, Provenance
from factory.ops.plan import build_plan, why_run


def publish(registry, spec, experiment):
    with registry.staging() as out:
        (out / "x").write_text(spec.fingerprint)
        return registry.publish(
            out, kind=spec.kind, fingerprint=spec.fingerprint, config=spec.config, inputs=spec.upstream, code=spec.code,
            provenance=Provenance(experiment=experiment, config_hash="h", git_commit="c"), summary={},
        )


def test_reason_names_the_changed_field_and_cached_stages_say_where_from(tmp_path, tiny_path):
    registry = ArtifactStore(tmp_path)
    experiment = load(tiny_path)
    digests = {}
    for kind in ("raw_datasets", "deduped_datasets", "filtered_datasets", "blend", "tokenizer"):
        digests[kind] = publish(registry, plan_stage(experiment, kind, digests), experiment.name).digest
    old = plan_stage(experiment, "pretrain", digests)
    publish(registry, old, experiment.name)
    changed = experiment.model_copy(update={"pretrain": experiment.pretrain.model_copy(update={"lr": 0.5})})
    new = plan_stage(changed, "pretrain", digests)
    assert why_run(experiment.name, new, registry.manifests()) == "pretrain.lr: 0.003 -> 0.5"
    plans = {p.kind: p for p in build_plan([changed], registry)}
    assert plans["blend"].status == "cached" and plans["blend"].detail.startswith(f"from {experiment.name}")
    assert plans["pretrain"].status == "run" and "pretrain.lr" in plans["pretrain"].detail
    assert plans["model"].status == "run" and plans["model"].detail == "never computed for this experiment"
    with registry.lease(new.fingerprint, "someone else"):
        assert {p.kind: p.status for p in build_plan([changed], registry)}["pretrain"] == "waiting"


HOLD_THEN_HANG = """\
import sys, time
from pathlib import Path
from factory.registry import ArtifactStore
with ArtifactStore(Path(sys.argv[1])).lease(sys.argv[2], "pretrain for tiny"):
    print("holding", flush=True)
    time.sleep(600)
"""


def test_a_lease_whose_holder_died_is_no_reason_to_wait(tmp_path, tiny_path):
    import signal
    import subprocess
    import sys

    registry = ArtifactStore(tmp_path)
    experiment = load(tiny_path)
    fingerprint = plan_stage(experiment, "raw_datasets", {}).fingerprint
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THEN_HANG, str(tmp_path), fingerprint], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "holding\n"
        assert {p.kind: p.status for p in build_plan([experiment], registry)}["raw_datasets"] == "waiting"
    finally:
        holder.send_signal(signal.SIGKILL)  # no `finally` of its own runs: the lease file stays, with a fresh heartbeat
        holder.wait()
    assert registry.holder(fingerprint) is not None
    plan = {p.kind: p for p in build_plan([experiment], registry)}["raw_datasets"]
    assert plan.status == "run"
    assert f"pid {holder.pid} is gone" in plan.detail


def test_a_lease_missing_keys_is_waited_on_then_ignored_with_a_warning(tmp_path, tiny_path, caplog):
    import os
    import time

    registry = ArtifactStore(tmp_path)
    experiment = load(tiny_path)
    fingerprint = plan_stage(experiment, "raw_datasets", {}).fingerprint
    lease = tmp_path / "leases" / f"{fingerprint}.lease"
    lease.parent.mkdir(parents=True)
    lease.write_text('{"owner": "old"}')
    plan = {p.kind: p for p in build_plan([experiment], registry)}["raw_datasets"]
    assert plan.status == "waiting" and "unreadable" in plan.detail
    assert str(lease) in caplog.text
    old = time.time() - 1000
    os.utime(lease, (old, old))
    plan = {p.kind: p for p in build_plan([experiment], registry)}["raw_datasets"]
    assert plan.status == "run" and "unreadable" in plan.detail


def test_a_garbage_manifest_is_skipped_by_the_plan_with_a_warning(tmp_path, tiny_path, caplog):
    registry = ArtifactStore(tmp_path)
    experiment = load(tiny_path)
    spec = plan_stage(experiment, "raw_datasets", {})
    raw = publish(registry, spec, experiment.name)
    (tmp_path / "manifests" / "garbage.json").write_text("\x00\x01 not json")
    deduped = plan_stage(experiment, "deduped_datasets", {"raw_datasets": raw.digest})
    registry.manifest_path(deduped.fingerprint).parent.mkdir(exist_ok=True)
    registry.manifest_path(deduped.fingerprint).write_text("{}")  # the manifest this plan looks up
    plans = {p.kind: p for p in build_plan([experiment], registry)}
    assert plans["raw_datasets"].status == "cached"
    assert plans["deduped_datasets"].status == "run"
    assert plans["tokenizer"].status == "run"
    assert "garbage.json" in caplog.text


def test_training_stages_show_their_ranks_and_how_the_ranks_share_the_model(tmp_path, tiny_path):
    from factory.ops.plan import describe_placement

    post = load(tiny_path.parent / "tiny-post-train.md")
    experiment = post.model_copy(update={
        "resources": post.resources.model_copy(update={"processes_per_node": 2}),
        "pretrain": post.pretrain.model_copy(update={"parallelism": "fsdp", "checkpoint_format": "sharded",
                                                     "activation_checkpointing": "full"}),
    })
    plans = {p.kind: p for p in build_plan([experiment], ArtifactStore(tmp_path))}
    assert plans["pretrain"].placement == {"nodes": 1, "processes": 2, "device": "cpu", "parallelism": "fsdp", "activation_checkpointing": "full"}
    assert describe_placement(plans["pretrain"].placement) == "1 node × 2 processes, cpu, fsdp, activation checkpointing full"
    assert plans["sft"].placement == {"nodes": 1, "processes": 2, "device": "cpu", "parallelism": "ddp"}, "no activation checkpointing: not said"
    assert describe_placement(plans["sft"].placement) == "1 node × 2 processes, cpu, ddp"
    assert describe_placement(plans["rl"].placement) == "1 node × 2 processes, cpu, learners 1, actors 1, backend gloo"
    assert plans["tokenizer"].placement == {} and describe_placement(plans["tokenizer"].placement) == ""
    assert plans["pretrain"].to_json()["placement"]["parallelism"] == "fsdp"
    on_gpus = experiment.model_copy(update={"resources": experiment.resources.model_copy(update={"gpus": 2})})
    plans = {p.kind: p for p in build_plan([on_gpus], ArtifactStore(tmp_path))}
    assert describe_placement(plans["pretrain"].placement) == "1 node × 2 processes, cuda x2, fsdp, activation checkpointing full"
    assert describe_placement(plans["rl"].placement) == "1 node × 2 processes, cuda x2, learners 1, actors 1, backend nccl", \
        "a GPU per rank: NCCL"
