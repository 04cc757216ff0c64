"""The example source-kind plugin (examples/git-source), installed as a package: a `git` source pinned to a commit of a
real repository is checked (its own fields, at their `file:line`), fingerprinted and ingested by the raw stage, and reads
that commit's files whatever happens on the branch since."""

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest
from dagster_pipes import DAGSTER_PIPES_CONTEXT_ENV_VAR

from factory.config import load, plan_stage
from factory.config.source_cache import CACHE_ENV, TREES
from factory.config.sources import source_root
from factory.data.catalog import CatalogConfig
from factory.registry.layout import SOURCES_FILE
from factory.registry.store import ArtifactStore, Provenance
from factory.runtime.__main__ import main
from factory.runtime.request import StageRequest
from tests.plugins.conftest import REPO, factory_with, installed, pip_installed
from tests.stages.test_chat_ingest import written

EXPERIMENT = """\
---
data:
  datasets:
    code:
      source:
        kind: git
        repo: {repo}
        commit: "{commit}"{more}
tokenizer: {{vocab_size: 300, min_frequency: 2, sample_bytes: 20000}}
---
A dataset read from one commit of a git repository.
"""
FIRST = {"pkg/a.py": "def a():\n    return 1\n", "notes.txt": "not code\n"}
SECOND = {"pkg/a.py": "def a():\n    return 2\n", "pkg/b.py": "def b():\n    return 3\n"}


@pytest.fixture(scope="module")
def git_site(tmp_path_factory) -> Path:
    return pip_installed(tmp_path_factory.mktemp("git-site"), REPO / "examples" / "git-source")


@pytest.fixture
def repo(tmp_path) -> Path:
    """A git repository whose branch has one commit, of `FIRST`'s files."""
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "--quiet", "--initial-branch=main")
    commit(path, FIRST)
    return path


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    """The factory's cache in the test's directory, for this process and the ones it starts."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(DAGSTER_PIPES_CONTEXT_ENV_VAR, raising=False)
    return tmp_path / "cache"


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.org"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env, timeout=60).stdout.strip()


def commit(repo: Path, files: dict[str, str]) -> str:
    """Commit `files` (written over the working tree) on the branch; the new commit's full sha."""
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "--all")
    git(repo, "commit", "--quiet", "-m", f"{len(files)} files")
    return git(repo, "rev-parse", "HEAD")


def experiment_file(tmp_path: Path, repo: Path, sha: str, more: str = "", name: str = "exp") -> Path:
    path = tmp_path / f"{name}.md"
    path.write_text(EXPERIMENT.format(repo=repo, commit=sha, more=more))
    return path


def run_raw(tmp_path: Path, path: Path) -> tuple[str, Path]:
    """Run the raw stage of the file's experiment in this process, against one registry and catalog in `tmp_path`: its
    fingerprint and artifact (already there when the stage is cached)."""
    spec = plan_stage(load(path), "raw_datasets", {})
    registry = ArtifactStore(tmp_path / "registry")
    if registry.lookup(spec.fingerprint) is None:
        request = StageRequest(spec=spec, registry=str(registry.root), catalog=CatalogConfig.local(tmp_path / "catalog"),
                               provenance=Provenance(experiment=path.stem, config_hash="0" * 16, git_commit="test"))
        assert main([str(request.write(tmp_path / f"{path.stem}-raw.json"))]) == 0
    return spec.fingerprint, registry.path(registry.lookup(spec.fingerprint).digest)


def ingested(tmp_path: Path, artifact: Path) -> dict[str, str]:
    """{path: text} of the documents the raw stage wrote."""
    _, table = written(tmp_path, artifact, "code")
    return dict(zip(table["path"].to_pylist(), table["text"].to_pylist(), strict=True))


def test_a_pinned_commit_is_ingested_and_a_later_commit_on_the_branch_changes_nothing_for_it(git_site, repo, tmp_path):
    first = git(repo, "rev-parse", "HEAD")
    pinned = experiment_file(tmp_path, repo, first[:7])
    with installed(git_site):
        fingerprint, artifact = run_raw(tmp_path, pinned)
        assert ingested(tmp_path, artifact) == {"pkg/a.py": FIRST["pkg/a.py"]}  # the include globs still pick: no notes.txt
        assert list(json.loads((artifact / SOURCES_FILE).read_text())["code"]) == ["pkg/a.py"]

        second = commit(repo, SECOND)
        (repo / "pkg" / "a.py").write_text("an edit in the working tree\n")
        assert run_raw(tmp_path, pinned) == (fingerprint, artifact)  # the same fingerprint: cached, nothing read again

        moved = experiment_file(tmp_path, repo, second, name="moved")
        moved_fingerprint, moved_artifact = run_raw(tmp_path, moved)
        assert moved_fingerprint != fingerprint
        assert ingested(tmp_path, moved_artifact) == {"pkg/a.py": SECOND["pkg/a.py"], "pkg/b.py": SECOND["pkg/b.py"]}
        assert plan_stage(load(moved), "raw_datasets", {}).config["sources"]["code"]["commit"] == second  # as written
    unpacked = sorted(p.name for p in (tmp_path / "cache" / TREES / "git").iterdir() if not p.name.startswith("."))
    assert unpacked == sorted([first, second])  # keyed by the full sha, however the file abbreviates it


def test_a_link_leading_out_of_the_tree_is_left_out(git_site, repo, tmp_path):
    (repo / "pkg" / "leak.py").symlink_to("/etc/hostname")
    (repo / "pkg" / "same.py").symlink_to("a.py")
    sha = commit(repo, {})
    with installed(git_site):
        _, artifact = run_raw(tmp_path, experiment_file(tmp_path, repo, sha))
        assert ingested(tmp_path, artifact) == {"pkg/a.py": FIRST["pkg/a.py"], "pkg/same.py": FIRST["pkg/a.py"]}


def test_racing_readers_of_one_commit_unpack_it_once(git_site, repo, tmp_path, cache):
    sha = git(repo, "rev-parse", "HEAD")
    with installed(git_site):
        source = load(experiment_file(tmp_path, repo, sha[:10])).data.datasets["code"].source
        roots: list[Path] = []
        threads = [threading.Thread(target=lambda: roots.append(source_root(source))) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(roots) == 4 and set(roots) == {cache / TREES / "git" / sha}
    assert sorted(p.name for p in (cache / TREES / "git").iterdir()) == [f".{sha}.lock", sha]
    assert sorted(p.relative_to(roots[0]).as_posix() for p in roots[0].rglob("*")) == ["notes.txt", "pkg", "pkg/a.py"]


def test_check_refuses_an_unknown_commit_with_its_file_and_line(git_site, repo, tmp_path):
    path = experiment_file(tmp_path, repo, "deadbee")
    result = factory_with(git_site, "check", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert (f"{path}:5: data.datasets.code.source: commit: 'deadbee' is no commit of {repo}; give the sha of one of its "
            f"commits (git -C {repo} log --oneline)") in result.stderr, result.stderr


def test_check_refuses_an_unknown_field_and_a_wrong_value_each_at_its_line(git_site, repo, tmp_path):
    path = experiment_file(tmp_path, repo, "not-a-sha", more="\n        branch: main")
    result = factory_with(git_site, "check", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"{path}:8: data.datasets.code.source.commit: String should match pattern" in result.stderr, result.stderr
    assert (f"{path}:9: data.datasets.code.source.branch: unknown key; allowed here: columns, commit, exclude, format, include, "
            "kind, max_file_bytes, path, repo, revision, text_field") in result.stderr, result.stderr


def test_check_refuses_a_missing_repository_and_one_outside_the_data_roots(git_site, tmp_path):
    missing = experiment_file(tmp_path, tmp_path / "nowhere", "abcd123", name="missing")
    outside = experiment_file(tmp_path, Path("/etc"), "abcd123", name="outside")
    result = factory_with(git_site, "check", str(missing), str(outside))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert (f"{missing}:5: data.datasets.code.source: repo: '{tmp_path / 'nowhere'}' is not a directory here; point repo at a "
            "local git repository") in result.stderr, result.stderr
    assert f"{outside}:7: data.datasets.code.source.repo: /etc is outside the directories the factory reads" in result.stderr


def test_a_pinned_commit_passes_the_check(git_site, repo, tmp_path):
    path = experiment_file(tmp_path, repo, git(repo, "rev-parse", "HEAD"))
    result = factory_with(git_site, "check", str(path))
    assert result.returncode == 0, result.stderr
