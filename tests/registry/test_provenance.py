"""git_commit on real throwaway git repositories: HEAD's sha, `-dirty`, and `unknown` outside git."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from factory.registry import git_commit
from factory.registry.provenance import file_state

GIT_IDENTITY = ["-c", "user.email=tests@example.com", "-c", "user.name=Tests", "-c", "commit.gpgsign=false"]


def git(repo: Path, *args: str) -> str:
    result = subprocess.run(["git", *GIT_IDENTITY, *args], cwd=repo, capture_output=True, text=True, check=True)
    return result.stdout.strip()


@pytest.fixture(autouse=True)
def no_enclosing_repo(monkeypatch, tmp_path):
    """Stop git's search at tmp_path, so a repository around the temp dir cannot leak in."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def repo(tmp_path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q")
    (path / "train.py").write_text("steps = 300\n")
    git(path, "add", "train.py")
    git(path, "commit", "-q", "-m", "first")
    return path


def test_clean_checkout_gives_the_head_sha(repo):
    head = git(repo, "rev-parse", "HEAD")
    assert re.fullmatch(r"[0-9a-f]{40}", head)
    assert git_commit(repo) == head


def test_follows_new_commits(repo):
    first = git_commit(repo)
    (repo / "train.py").write_text("steps = 600\n")
    git(repo, "commit", "-q", "-am", "second")
    assert git_commit(repo) == git(repo, "rev-parse", "HEAD")
    assert git_commit(repo) != first


def test_modified_tracked_file_marks_the_commit_dirty(repo):
    head = git(repo, "rev-parse", "HEAD")
    (repo / "train.py").write_text("steps = 1\n")
    assert git_commit(repo) == head + "-dirty"


def test_staged_change_marks_the_commit_dirty(repo):
    head = git(repo, "rev-parse", "HEAD")
    (repo / "new.py").write_text("x = 1\n")
    git(repo, "add", "new.py")
    assert git_commit(repo) == head + "-dirty"


def test_untracked_files_do_not_mark_the_commit_dirty(repo):
    (repo / "scratch.txt").write_text("notes\n")
    assert git_commit(repo) == git(repo, "rev-parse", "HEAD")


def test_works_from_a_subdirectory(repo):
    (repo / "pkg").mkdir()
    (repo / "pkg" / "mod.py").write_text("y = 2\n")
    git(repo, "add", "pkg/mod.py")
    git(repo, "commit", "-q", "-m", "pkg")
    assert git_commit(repo / "pkg") == git(repo, "rev-parse", "HEAD")


def test_outside_a_git_repository_is_unknown(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    assert git_commit(plain) == "unknown"


def test_repository_without_commits_is_unknown(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q")
    assert git_commit(empty) == "unknown"


def test_missing_directory_is_unknown(tmp_path):
    assert git_commit(tmp_path / "does-not-exist") == "unknown"


def test_an_untracked_experiment_file_marks_its_run_dirty(repo):
    head = git(repo, "rev-parse", "HEAD")
    (repo / "exp.md").write_text("---\nseed: 1\n---\n")
    assert file_state(repo / "exp.md") == "untracked"
    assert git_commit(repo, files=[repo / "exp.md"]) == head + "-dirty"
    git(repo, "add", "exp.md")
    git(repo, "commit", "-q", "-m", "exp")
    assert file_state(repo / "exp.md") is None
    assert git_commit(repo, files=[repo / "exp.md"]) == git(repo, "rev-parse", "HEAD")


def test_a_modified_or_ignored_experiment_file_is_not_its_commit(repo):
    (repo / ".gitignore").write_text("scratch/\n")
    (repo / "exp.md").write_text("---\nseed: 1\n---\n")
    git(repo, "add", ".gitignore", "exp.md")
    git(repo, "commit", "-q", "-m", "exp")
    (repo / "exp.md").write_text("---\nseed: 2\n---\n")
    assert file_state(repo / "exp.md") == "modified"
    (repo / "scratch").mkdir()
    (repo / "scratch" / "mine.md").write_text("---\nseed: 3\n---\n")
    assert file_state(repo / "scratch" / "mine.md") == "ignored by git"
    assert git_commit(repo, files=[repo / "scratch" / "mine.md"]).endswith("-dirty")


def test_an_experiment_file_outside_any_repository_is_dirty(repo, tmp_path):
    (tmp_path / "loose").mkdir()
    (tmp_path / "loose" / "exp.md").write_text("---\nseed: 1\n---\n")
    assert file_state(tmp_path / "loose" / "exp.md") == "outside any git repository"
    assert git_commit(repo, files=[tmp_path / "loose" / "exp.md"]).endswith("-dirty")
