"""The atomic-write helpers: a file is replaced whole, its temp file never stays behind, and modes are kept."""

import os
import stat

import pytest

from factory.atomic import synced_temp, write_atomic


def test_write_atomic_replaces_the_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "ref"
    write_atomic(path, "old")
    write_atomic(path, b"new")
    assert path.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["ref"]


def test_the_mode_is_the_one_asked_for_under_the_umask(tmp_path):
    old_umask = os.umask(0o022)
    try:
        write_atomic(tmp_path / "shared", "x")
        write_atomic(tmp_path / "private", "x", mode=0o600)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE((tmp_path / "shared").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o600


def test_a_synced_temp_is_whole_before_it_is_linked_and_gone_after(tmp_path):
    path = tmp_path / "lease"
    path.write_text("someone else's")
    with synced_temp(path, "mine") as tmp:
        assert tmp.parent == tmp_path and tmp.name.endswith(".tmp") and tmp.read_text() == "mine"
        with pytest.raises(FileExistsError):
            os.link(tmp, path)  # an exclusive create stays the caller's choice
    assert path.read_text() == "someone else's"
    assert [p.name for p in tmp_path.iterdir()] == ["lease"]


def test_a_failed_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "record"
    path.write_text("old")
    with pytest.raises(TypeError):
        write_atomic(path, 42)  # type: ignore[arg-type]
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["record"]
