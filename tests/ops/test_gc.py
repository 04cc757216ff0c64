"""`factory registry gc`: what no experiment at HEAD, alias, ref or running stage needs goes, after a dry run; nothing
reachable ever does."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import threading
import uuid

import pytest
from typer.testing import CliRunner

from factory.cli import app
from factory.config import load, plan_stage
from factory.config.stages import stages_of
from factory.evals.base import EVALUATIONS
from factory.ops.gc import collect, plan_collection
from factory.ops.plan import build_plan
from factory.registry import ArtifactStore, Provenance
from factory.registry.aliases import history
from tests.forked import factory_command

runner = CliRunner()


def publish(registry: ArtifactStore, kind: str, fingerprint: str, inputs: dict[str, str], experiment: str,
            summary: dict | None = None, config: dict | None = None) -> str:
    with registry.staging() as out:
        (out / "data.bin").write_bytes(fingerprint.encode() * 100)
        return registry.publish(out, kind=kind, fingerprint=fingerprint, config=config or {}, inputs=inputs, code="local:0",
                                provenance=Provenance(experiment=experiment, config_hash="h", git_commit="c"),
                                summary=summary or {}).digest


def publish_experiment(registry: ArtifactStore, experiment) -> dict[str, str]:
    """Every stage of `experiment` as `factory plan` plans it, published: the experiment is all cached."""
    digests: dict[str, str] = {}
    for kind in stages_of(experiment):
        spec = plan_stage(experiment, kind, digests)
        digests[kind] = publish(registry, kind, spec.fingerprint, spec.upstream, experiment.name, config=spec.config)
    return digests


@pytest.fixture
def history_of_a_lab(tmp_path, tiny_path):
    """A registry where `tiny` (at HEAD) is all cached, and beside it: an experiment removed from the repository (its
    pretrain and model, an evaluation of that pretrain), one removed whose model was promoted, an evaluation of tiny's
    pretrain and tiny's run report."""
    registry = ArtifactStore(tmp_path / "registry")
    tiny = load(tiny_path)
    current = publish_experiment(registry, tiny)
    shared = {"blend": current["blend"], "tokenizer": current["tokenizer"]}
    gone = {"pretrain": publish(registry, "pretrain", "gone-pretrain", shared, "gone")}
    gone["model"] = publish(registry, "model", "gone-model", {"pretrain": gone["pretrain"], "tokenizer": current["tokenizer"]}, "gone")
    gone["result"] = publish(registry, EVALUATIONS, "gone-result", shared, "gone", summary={"training": gone["pretrain"]})
    promoted = {"pretrain": publish(registry, "pretrain", "promoted-pretrain", shared, "promoted")}
    promoted["model"] = publish(registry, "model", "promoted-model", {"pretrain": promoted["pretrain"]}, "promoted")
    history(registry, "production").append({"action": "promote", "model": promoted["model"], "reason": "r", "by": "me"})
    kept = {"result": publish(registry, EVALUATIONS, "tiny-result", shared, tiny.name, summary={"training": current["pretrain"]}),
            "report": publish(registry, "run_report", "tiny-report", current, tiny.name)}
    return registry, tiny, current, gone, promoted, kept


def test_a_collection_removes_only_what_nothing_needs_and_the_experiments_at_head_stay_cached(history_of_a_lab):
    registry, tiny, current, gone, promoted, kept = history_of_a_lab
    everything = {m.digest: m for m in registry.manifests()}

    young = plan_collection(registry, [tiny])  # all of it published a moment ago: within the minimum age
    assert young.garbage == []

    collection = plan_collection(registry, [tiny], min_age_s=0)
    assert {m.digest for m in collection.garbage} == set(gone.values())
    assert collection.keep[promoted["pretrain"]].startswith("made ")  # the lineage of a promoted model
    assert collection.keep[kept["result"]] == f"describes {current['pretrain'][:12]}"
    assert collection.bytes == sum(everything[d].files["data.bin"]["bytes"] for d in gone.values())

    removal = collect(registry, collection)
    assert {m.digest for m in removal.removed} == set(gone.values()) and removal.in_use == []
    for digest in gone.values():
        assert not registry.path(digest).exists()
        assert registry.lookup(everything[digest].fingerprint) is None
    for digest, manifest in everything.items():
        if digest not in gone.values():
            assert registry.lookup(manifest.fingerprint, rehash=True) == manifest
    assert {p.status for p in build_plan([tiny], registry)} == {"cached"}
    assert plan_collection(registry, [tiny], min_age_s=0).garbage == []


def test_a_changed_experiment_keeps_its_newest_artifacts_until_a_run_makes_the_next(tmp_path, tiny_path):
    registry = ArtifactStore(tmp_path / "registry")
    tiny = load(tiny_path)
    current = publish_experiment(registry, tiny)
    changed = tiny.model_copy(update={"pretrain": tiny.pretrain.model_copy(update={"lr": 0.5})})
    # the changed file is at HEAD, its pretrain not run yet: the last pretrain and model made for it stay
    collection = plan_collection(registry, [changed], min_age_s=0)
    assert collection.garbage == []
    assert collection.keep[current["pretrain"]] == f"{tiny.name}: its newest pretrain"
    assert collection.keep[current["blend"]] == f"{tiny.name}: its blend"


def test_a_stage_computing_or_reading_an_artifact_keeps_it(history_of_a_lab):
    registry, tiny, _current, gone, _promoted, _kept = history_of_a_lab
    everything = {m.digest: m for m in registry.manifests()}
    collection = plan_collection(registry, [tiny], min_age_s=0)
    started, release = threading.Event(), threading.Event()

    def computing() -> None:  # a stage that holds its lease and reads the gone pretrain, started after the dry run
        with registry.lease("someone-elses-stage", "sft for gone (pid 1 on elsewhere)", needs=[gone["pretrain"]]):
            started.set()
            release.wait()

    reader = threading.Thread(target=computing)
    reader.start()
    started.wait()
    try:
        with registry.lease(everything[gone["result"]].fingerprint, "evaluation for gone"):
            removal = collect(registry, collection)
    finally:
        release.set()
        reader.join()
    assert {m.digest for m in removal.removed} == {gone["model"]}
    assert {m.digest: why for m, why in removal.in_use} == {
        gone["pretrain"]: "sft for gone (pid 1 on elsewhere) reads it",
        gone["result"]: "evaluation for gone is computing it",
    }
    assert registry.lookup(everything[gone["pretrain"]].fingerprint) is not None
    assert plan_collection(registry, [tiny], min_age_s=0).keep.get(gone["pretrain"]) is None  # released: garbage again


def test_the_command_lists_first_removes_with_delete_and_keeps_what_is_at_head(tmp_path, tiny_path):
    repo = tmp_path / "repo"
    (repo / "experiments").mkdir(parents=True)
    file = repo / "experiments" / "tiny.md"
    file.write_text(tiny_path.read_text().replace("data/", str(tiny_path.parents[1] / "data") + "/"))
    (repo / "experiments" / "README.md").write_text("# not an experiment\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    root = tmp_path / "root"
    registry = ArtifactStore(root / "registry")
    tiny = load(file)
    publish_experiment(registry, tiny)
    orphan = publish(registry, "tokenizer", "orphan", {}, "gone")
    file.unlink()  # removed from the working tree, still at HEAD: its artifacts stay
    args = ["registry", "gc", str(repo / "experiments"), "--root", str(root), "--min-age-hours", "0"]

    dry = runner.invoke(app, args)
    assert dry.exit_code == 0, dry.output
    assert orphan[:12] in dry.output and "1 artifacts (" in dry.output
    assert "--min-age-hours 0 --delete" in " ".join(dry.output.split()), dry.output  # the advice removes what the dry run listed
    assert registry.path(orphan).exists()
    shown = json.loads(runner.invoke(app, [*args, "--json"]).output)
    assert [g["digest"] for g in shown["garbage"]] == [orphan] and shown["bytes"] == 600

    done = runner.invoke(app, [*args, "--delete"])
    assert done.exit_code == 0, done.output
    assert "removed 1 artifacts (600 B)" in done.output
    assert not registry.path(orphan).exists()
    assert {p.status for p in build_plan([tiny], registry)} == {"cached"}

    (repo / "experiments" / "broken.md").write_text("---\nseed: [\n---\n")
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2
    assert "broken.md" in refused.output and "every one must load" in refused.output

    # A file that parses but does not load, never run here (nothing in the registry made for its name): gc goes on, saying
    # so; once something was made for it, gc cannot tell which of that it needs, and refuses.
    (repo / "experiments" / "broken.md").unlink()
    (repo / "experiments" / "never-run.md").write_text("---\npretrain: {steps: many}\n---\n")
    noted = runner.invoke(app, args)
    assert noted.exit_code == 0 and "was made for 'never-run': gc keeps nothing for it" in " ".join(noted.output.split()), noted.output
    publish(registry, "tokenizer", "made-for-it", {}, "never-run")
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2 and "never-run.md" in refused.output and "every one must load" in refused.output


def test_garbage_whose_files_were_damaged_or_lost_is_removed_all_the_same(tmp_path):
    """A lookup refuses an artifact whose bytes are not what its manifest says (a cache miss): gc removes such garbage
    as it removes the rest, without hashing it first."""
    registry = ArtifactStore(tmp_path / "registry")
    changed, lost = publish(registry, "tokenizer", "changed", {}, "x"), publish(registry, "tokenizer", "lost", {}, "x")
    for digest in (changed, lost):  # published artifacts are read-only
        registry.path(digest).chmod(0o755)
        (registry.path(digest) / "data.bin").chmod(0o644)
    (registry.path(changed) / "data.bin").write_bytes(b"other bytes")
    (registry.path(lost) / "data.bin").unlink()
    assert registry.lookup("changed", rehash=True) is None and registry.lookup("lost") is None
    collection = plan_collection(registry, [], min_age_s=0)
    assert {m.digest for m in collection.garbage} == {changed, lost}
    removal = collect(registry, collection)
    assert {m.digest for m in removal.removed} == {changed, lost} and removal.in_use == []
    assert list(registry.manifests()) == [] and not registry.path(changed).exists()


def test_a_collection_of_a_store_removes_the_objects_too(tmp_path, s3_server, monkeypatch):
    from factory.registry.objects import ObjectRegistry
    from factory.storage import open_store

    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    registry = ObjectRegistry(open_store(f"s3://{s3_server.bucket}/gc-{uuid.uuid4().hex}"), tmp_path / "local")
    kept = publish(registry, "tokenizer", "kept", {}, "x")
    gone = publish(registry, "tokenizer", "gone", {}, "x")
    registry.open(gone)  # a local copy, which goes with it
    registry.set_ref("leaderboard", kept)
    collection = plan_collection(registry, [], min_age_s=0)
    assert [m.digest for m in collection.garbage] == [gone]
    with registry.lease("gone", "tokenizer for x"):  # being computed again right now: left
        assert [(m.digest, why) for m, why in collect(registry, collection).in_use] == [(gone, "tokenizer for x is computing it")]
    assert registry.lookup("gone") is not None
    assert [m.digest for m in collect(registry, collection).removed] == [gone]
    keys = registry.store.list()
    assert not [k for k in keys if gone in k] and f"objects/{kept}/data.bin" in keys
    assert not (tmp_path / "local" / "cache" / "objects" / gone).exists()
    assert registry.lookup("kept") is not None and registry.lookup("gone") is None


def test_a_work_directory_saved_in_the_store_from_another_machine_is_seen_and_removed(tmp_path, s3_server, monkeypatch):
    from factory.registry.objects import ObjectRegistry
    from factory.storage import open_store

    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    uri = f"s3://{s3_server.bucket}/gc-{uuid.uuid4().hex}"
    elsewhere = ObjectRegistry(open_store(uri), tmp_path / "elsewhere")  # the machine where the run stopped
    (elsewhere.work("stopped-run") / "step_000010.pt").write_bytes(b"w" * 100)
    (elsewhere.work("stopped-run") / "step_000010.json").write_bytes(b"{}")
    elsewhere.save_work("stopped-run")
    registry = ObjectRegistry(open_store(uri), tmp_path / "here")  # no copy of it on this machine
    assert not registry.work_path("stopped-run").exists()
    assert plan_collection(registry, []).work == {}  # saved a moment ago: within the minimum age
    collection = plan_collection(registry, [], min_age_s=0)
    assert collection.work == {"stopped-run": 102} and collection.bytes == 102
    assert collect(registry, collection).work == ["stopped-run"]
    assert registry.store.list("work/") == []


def test_gc_runs_as_a_command_line_program(tmp_path):
    result = factory_command("registry", "gc", str(tmp_path / "nothing"), "--root", str(tmp_path))
    assert result.returncode == 2 and "no such file or directory" in result.stderr and "Traceback" not in result.stderr


def test_a_stage_lease_lists_its_inputs_and_the_checkpoints_its_config_names():
    from factory.config.stages import StageSpec
    from factory.runtime.__main__ import reads

    checkpoint, blend = "a" * 64, "b" * 64
    spec = StageSpec(kind="evaluation", config={"items": [{"checkpoint": {"path": f"/r/registry/objects/{checkpoint}/step_000040.pt"}}]},
                     upstream={"blend": blend}, code="local:0")
    assert reads(spec) == [checkpoint, blend]


def test_two_manifests_of_the_same_bytes_keep_them_until_both_go(tmp_path):
    registry = ArtifactStore(tmp_path / "registry")
    twins = []
    for fingerprint in ("twin-a", "twin-b"):
        with registry.staging() as out:
            (out / "data.bin").write_bytes(b"same" * 10)
            twins.append(registry.publish(out, kind="tokenizer", fingerprint=fingerprint, config={}, inputs={}, code="local:0",
                                          provenance=Provenance(experiment="gone", config_hash="h", git_commit="c"), summary={}))
    collection = plan_collection(registry, [], min_age_s=0)
    assert {m.fingerprint for m in collection.garbage} == {"twin-a", "twin-b"} and collection.bytes == 40
    first = dataclasses.replace(collection, garbage=collection.garbage[:1])
    assert collect(registry, first).bytes == 0  # the other manifest still names the bytes
    assert registry.path(twins[0].digest).is_dir()
    assert collect(registry, plan_collection(registry, [], min_age_s=0)).bytes == 40
    assert not registry.path(twins[0].digest).exists() and list(registry.manifests()) == []


def test_a_work_directory_no_experiment_plans_goes_unless_its_stage_is_computing(tmp_path, tiny_path):
    registry = ArtifactStore(tmp_path / "registry")
    tiny = load(tiny_path)
    planned = plan_stage(tiny, "raw_datasets", {}).fingerprint  # its stage not run yet: a relaunch resumes from its work
    for fingerprint in (planned, "stopped-run", "running-stage"):
        (registry.work(fingerprint) / "step_000010.pt").write_bytes(b"w" * 100)
    young = plan_collection(registry, [tiny])
    assert young.work == {}  # changed a moment ago: within the minimum age
    collection = plan_collection(registry, [tiny], min_age_s=0)
    assert collection.work == {"stopped-run": 100, "running-stage": 100} and collection.bytes == 200
    with registry.lease("running-stage", "pretrain for gone"):
        removal = collect(registry, collection)
    assert removal.work == ["stopped-run"] and removal.work_in_use == [("running-stage", "pretrain for gone is computing it")]
    assert not registry.work_path("stopped-run").exists()
    assert registry.work_path(planned).is_dir() and registry.work_path("running-stage").is_dir()
