"""`python -m factory.runtime`: argument and request errors, and a real raw-data stage run in-process."""

import json
from pathlib import Path

import pytest
from dagster_pipes import DAGSTER_PIPES_CONTEXT_ENV_VAR

from factory.config import Experiment, load, plan_stage
from factory.data.catalog import CatalogConfig, open_catalog
from factory.registry.layout import DATASETS_FILE
from factory.registry.store import ArtifactStore, Provenance
from factory.runtime.__main__ import USAGE, main
from factory.ops.plan import build_plan
from factory.runtime.request import StageRequest

SOURCES = {f"lib/mod_{i}.py": f"def f{i}(x):\n    return x * {i}\n" for i in range(8)}


@pytest.fixture
def stdlib(tmp_path, monkeypatch):
    """A small source tree the experiment's one dataset reads."""
    root = tmp_path / "src"
    for rel, text in SOURCES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    monkeypatch.delenv(DAGSTER_PIPES_CONTEXT_ENV_VAR, raising=False)
    return root


def on_directory(experiment: Experiment, root: Path, name: str = "code") -> Experiment:
    """The experiment with one dataset read from `root`."""
    data = experiment.data.model_validate({"datasets": {name: {"source": {"kind": "directory", "path": str(root)}}}})
    return experiment.model_copy(update={"data": data})


def corpus_request(tmp_path: Path, tiny_path: Path) -> StageRequest:
    return StageRequest(
        spec=plan_stage(on_directory(load(tiny_path), tmp_path / "src"), "raw_datasets", {}),
        registry=str(tmp_path / "registry"),
        catalog=CatalogConfig.local(tmp_path / "catalog"),
        provenance=Provenance(experiment="tiny-code-lm", config_hash="0" * 16, git_commit="test"),
    )


def reported(out: str) -> dict:
    """The materialization the console reporter printed (the last JSON document on stdout)."""
    return json.loads(out[out.index('{\n  "data_version"') :])


@pytest.mark.parametrize("argv", [[], ["a.json", "b.json"]])
def test_wrong_number_of_arguments_is_a_usage_error(argv, capsys):
    assert main(argv) == 2
    assert USAGE in capsys.readouterr().err


def test_a_request_that_is_not_json_is_refused_clearly(tmp_path, capsys):
    path = tmp_path / "request.json"
    path.write_text("this is { not json")
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert "not a stage request" in err
    assert str(path) in err


def test_a_missing_request_file_is_refused(tmp_path, capsys):
    assert main([str(tmp_path / "absent.json")]) == 2
    assert "not a stage request" in capsys.readouterr().err


def test_an_unknown_stage_kind_is_refused(tmp_path, tiny_path, stdlib, capsys):
    data = corpus_request(tmp_path, tiny_path).to_json()
    data["spec"]["kind"] = "distillation"
    path = tmp_path / "request.json"
    path.write_text(json.dumps(data))
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert "unknown stage kind 'distillation'" in err
    assert "raw_datasets" in err
    assert not (tmp_path / "registry" / "objects").exists()


def test_request_round_trips_through_json(tmp_path, tiny_path, stdlib):
    request = corpus_request(tmp_path, tiny_path)
    again = StageRequest.read(request.write(tmp_path / "request.json"))
    assert again == request
    assert again.spec.fingerprint == request.spec.fingerprint


def test_raw_data_stage_publishes_once_and_reuses_its_artifact(tmp_path, tiny_path, stdlib, capsys):
    request = corpus_request(tmp_path, tiny_path)
    path = request.write(tmp_path / "request.json")
    objects = tmp_path / "registry" / "objects"

    assert main([str(path)]) == 0
    first = reported(capsys.readouterr().out)
    registry = ArtifactStore(request.registry)
    manifest = registry.lookup(request.spec.fingerprint)
    assert manifest is not None
    assert manifest.kind == "raw_datasets"
    assert manifest.experiment == "tiny-code-lm"
    assert first["data_version"] == manifest.digest
    assert first["metadata"]["summary/code/rows"] == len(SOURCES)
    assert first["metadata"]["summary/code/table"] == "raw.code@v1"
    assert first["metadata"]["cache"] == "miss"
    corpus = json.loads((registry.open(manifest.digest) / DATASETS_FILE).read_text())["code"]
    assert corpus["bytes"] == sum(len(t.encode()) for t in SOURCES.values())
    assert [p.name for p in objects.iterdir()] == [manifest.digest]

    (stdlib / "lib" / "mod_0.py").write_text("changed = True\n")  # the same fingerprint: not re-read
    assert main([str(path)]) == 0
    second = reported(capsys.readouterr().out)
    assert second["metadata"]["cache"] == "hit"
    assert second["data_version"] == manifest.digest
    assert [p.name for p in objects.iterdir()] == [manifest.digest]
    assert len(list((tmp_path / "registry" / "manifests").glob("*/*.json"))) == 1
    table = open_catalog(request.catalog).load_table(corpus["table"])
    assert table.current_snapshot().snapshot_id == first["metadata"]["summary/code/snapshot_id"]
    assert table.snapshot_by_name(corpus["content_tag"]).snapshot_id == first["metadata"]["summary/code/snapshot_id"]


def test_each_log_line_is_written_once_when_stages_run_in_one_process(tmp_path, tiny_path, stdlib, capsys):
    experiment = load(tiny_path)
    for name in ("first", "second"):  # two fingerprints: both runs publish and log it
        variant = on_directory(experiment, stdlib, name)
        base = corpus_request(tmp_path, tiny_path)
        spec = plan_stage(variant, "raw_datasets", {})
        request = StageRequest(spec=spec, registry=base.registry, catalog=base.catalog, provenance=base.provenance)
        assert main([str(request.write(tmp_path / f"{name}.json"))]) == 0
        assert capsys.readouterr().err.count("published raw_datasets artifact") == 1


def test_plan_names_the_source_files_added_or_changed_since_the_last_ingest(tmp_path, tiny_path, stdlib, capsys):
    request = corpus_request(tmp_path, tiny_path)
    assert main([str(request.write(tmp_path / "request.json"))]) == 0
    capsys.readouterr()
    experiment = on_directory(load(tiny_path), stdlib)
    registry = ArtifactStore(request.registry)
    assert {p.kind: p.status for p in build_plan([experiment], registry)}["raw_datasets"] == "cached"

    (stdlib / "lib" / "new.py").write_text("def g():\n    return 1\n")
    (stdlib / "lib" / "mod_1.py").write_text("def f1(x):\n    return x + 1\n")
    (stdlib / "lib" / "mod_2.py").unlink()
    raw = {p.kind: p for p in build_plan([experiment], registry)}["raw_datasets"]
    assert raw.status == "run"
    assert raw.detail == "source code: 1 added (lib/new.py), 1 changed (lib/mod_1.py), 1 removed (lib/mod_2.py)"

    again = StageRequest(spec=plan_stage(experiment, "raw_datasets", {}), registry=request.registry, catalog=request.catalog,
                         provenance=request.provenance)
    assert main([str(again.write(tmp_path / "again.json"))]) == 0
    rows = reported(capsys.readouterr().out)["metadata"]["summary/code/rows"]
    assert rows == len(SOURCES)  # one file added, one removed: all of today's files are read
    assert {p.kind: p.status for p in build_plan([experiment], registry)}["raw_datasets"] == "cached"


def test_the_raw_stage_refuses_files_that_changed_after_it_was_planned(tmp_path, tiny_path, stdlib, capsys):
    request = corpus_request(tmp_path, tiny_path)
    (stdlib / "lib" / "late.py").write_text("x = 1\n")
    assert main([str(request.write(tmp_path / "request.json"))]) == 1
    assert "changed after this stage was planned; run it again" in capsys.readouterr().err
    assert ArtifactStore(request.registry).lookup(request.spec.fingerprint) is None
