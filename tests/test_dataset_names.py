"""One dataset name, two definitions: `factory check` warns, naming both experiments, and passes."""

import subprocess
from pathlib import Path

from factory.registry import ArtifactStore, Provenance
from factory.preflight import check_files
from tests.forked import factory_command

RECIPE = """\
---
name: {name}
data:
  datasets:
    notes:
      source: {{kind: directory, path: {source}, include: ['*.txt']}}
  blend: [{{dataset: notes}}]
pretrain: {{steps: 10}}
---
why
"""


def repository(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "empty"], cwd=repo, check=True)  # a file of none is untracked
    for name in ("mine", "theirs"):
        (repo / "data" / name).mkdir(parents=True)
        (repo / "data" / name / "a.txt").write_text(f"{name}\n")
    return repo


def recipe(path: Path, name: str, source: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(RECIPE.format(name=name, source=source))
    return path


def test_another_file_of_the_repository_defining_the_dataset_otherwise_is_named(tmp_path):
    repo = repository(tmp_path)
    mine = recipe(repo / "experiments" / "mine.md", "mine", repo / "data" / "mine")
    theirs = recipe(repo / "team" / "theirs.md", "theirs", repo / "data" / "theirs")
    [report] = check_files([mine])
    assert report.ok, report.errors
    [warning] = [w for w in report.warnings if "also defined" in w]
    assert warning.startswith(f"{mine}:5: data.datasets.notes: dataset 'notes' is also defined, with another source, by experiment "
                              f"'theirs' ({theirs}): both write raw.notes, dedup.notes and filtered.notes"), warning
    assert "raw.notes@v3 still read what they named" in warning


def test_the_same_source_under_one_name_is_shared_on_purpose(tmp_path):
    repo = repository(tmp_path)
    mine = recipe(repo / "experiments" / "mine.md", "mine", repo / "data" / "mine")
    recipe(repo / "team" / "theirs.md", "theirs", repo / "data" / "mine")
    [report] = check_files([mine])
    assert not [w for w in report.warnings if "also defined" in w], report.warnings


def test_a_definition_recorded_in_the_registry_is_named_by_check_and_run(tmp_path):
    repo = repository(tmp_path)
    mine = recipe(repo / "mine.md", "mine", repo / "data" / "mine")
    registry = ArtifactStore(tmp_path / "state" / "registry")
    sources = {"notes": {"kind": "directory", "path": "/elsewhere/notes", "include": ["*.md"]}}
    with registry.staging() as out:
        (out / "datasets.json").write_text("{}")
        registry.publish(out, kind="raw_datasets", fingerprint="fp-theirs", config={"sources": sources, "files": {}}, inputs={},
                         code="c", provenance=Provenance(experiment="teammate", config_hash="h", git_commit="g"), summary={})
    [report] = check_files([mine], registry=registry)
    assert report.ok and any("by experiment 'teammate' (recorded in the registry: raw stage" in w for w in report.warnings), report
    # `factory run`'s preflight is the same check: it warns, then goes on (to the commit check, which --strict refuses here).
    run = factory_command("run", str(mine), "--root", str(tmp_path / "state"), "--strict", cwd=repo)
    assert run.returncode == 2 and f"warning: {mine}:5: data.datasets.notes: dataset 'notes' is also defined" in run.stderr, run.stderr
    assert "untracked; commit it (or drop --strict)" in run.stderr
