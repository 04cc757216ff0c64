"""Fetching a git remote into the sensor's clone: what each fault says to change; the forge URL of a file."""

import pytest

from factory.registry.remote import RemoteError, fetch_branch, file_url


def test_refused_credentials_say_how_to_give_git_a_key(tmp_path, monkeypatch):
    refuse = "sh -c 'echo \"git@forge: Permission denied (publickey).\" >&2; exit 255'"
    monkeypatch.setenv("GIT_SSH_COMMAND", refuse)
    with pytest.raises(RemoteError, match="refused the credentials.*GIT_SSH_COMMAND"):
        fetch_branch("ssh://git@forge.invalid/org/repo.git", "main", tmp_path / "clone")


def test_an_unreachable_remote_names_the_setting(tmp_path):
    with pytest.raises(RemoteError, match="cannot reach .*FACTORY_GIT_REMOTE"):
        fetch_branch(str(tmp_path / "nowhere.git"), "main", tmp_path / "clone")
    assert (tmp_path / "clone" / "HEAD").exists()  # the sensor's bare clone, made on first use


def test_a_path_with_401_in_it_is_not_refused_credentials(tmp_path):
    """git names the missing repository's path: a `401` in it (pytest's `pytest-401` directory) is no HTTP status."""
    with pytest.raises(RemoteError, match="cannot reach .*FACTORY_GIT_REMOTE"):
        fetch_branch(str(tmp_path / "pytest-401" / "nowhere-403.git"), "main", tmp_path / "clone")


def test_file_url_on_a_forge_leaves_credentials_out():
    url = file_url("https://user:token@github.com/org/repo.git", "abc", "experiments/x.md")
    assert url == "https://github.com/org/repo/blob/abc/experiments/x.md"
    assert file_url("git@github.com:org/repo.git", "abc", "x.md") is None
