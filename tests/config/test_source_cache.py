"""The bounded cache of directories source kinds materialise: filled once, atomically, by one of racing callers; the least
recently used entries go first once it holds more than its bound, never one in use."""

import os
import threading
import time
from pathlib import Path

import pytest

from factory.config.source_cache import BOUND_ENV, CACHE_ENV, IN_USE_GRACE_S, TREES, source_cache
from factory.errors import ConfigError

ENTRY_BYTES = 1000


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(BOUND_ENV, raising=False)
    return tmp_path / "cache" / TREES


def filler(calls: list[str], text: str = "x" * ENTRY_BYTES, pause_s: float = 0.0):
    """A fill that writes one file of `text` (after `pause_s`, so racing callers overlap) and records each call."""
    def fill(directory: Path) -> None:
        calls.append(directory.name)
        time.sleep(pause_s)
        (directory / "file.txt").write_text(text)
    return fill


def entries(cache: Path, kind: str = "k") -> list[str]:
    """The directories under a kind's part of the cache (entries, and fills in progress or cut short)."""
    return sorted(p.name for p in (cache / kind).iterdir() if p.is_dir())


def used_ago(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_an_entry_is_filled_once_then_reused(cache):
    calls: list[str] = []
    first = source_cache("k", "abc", filler(calls, "hello"))
    again = source_cache("k", "abc", filler(calls, "other"))
    assert first == again == cache / "k" / "abc"
    assert (first / "file.txt").read_text() == "hello" and len(calls) == 1
    assert entries(cache) == ["abc"]


def test_a_fill_that_fails_leaves_nothing_and_the_next_use_fills_again(cache):
    def broken(directory: Path) -> None:
        (directory / "half.txt").write_text("half")
        raise RuntimeError("git died")

    with pytest.raises(RuntimeError, match="git died"):
        source_cache("k", "abc", broken)
    assert entries(cache) == []
    assert (source_cache("k", "abc", filler([], "whole")) / "file.txt").read_text() == "whole"


def test_racing_callers_of_one_key_end_with_one_copy_filled_once(cache):
    calls: list[str] = []
    found: list[Path] = []
    threads = [threading.Thread(target=lambda: found.append(source_cache("k", "abc", filler(calls, pause_s=0.2)))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(found) == 4 and set(found) == {cache / "k" / "abc"}
    assert len(calls) == 1 and entries(cache) == ["abc"]


def test_the_least_recently_used_entries_go_first_and_those_in_use_stay(cache, monkeypatch):
    for key in ("a", "b", "c"):
        source_cache("k", key, filler([]))
    for key, hours in (("a", 3), ("b", 2), ("c", 1.5)):
        used_ago(cache / "k" / key, hours * 3600)
    source_cache("k", "a", filler([]))  # used again now: the newest
    monkeypatch.setenv(BOUND_ENV, str(3.5 * ENTRY_BYTES / (1 << 30)))
    source_cache("k", "d", filler([]))
    assert entries(cache) == ["a", "c", "d"]  # b, the least recently used, made room

    monkeypatch.setenv(BOUND_ENV, "0")
    source_cache("other", "e", filler([]))
    assert entries(cache) == ["a", "d"]  # in use (within the grace) though over the bound: kept
    assert entries(cache, "other") == ["e"]
    assert not (cache / "k" / ".b.lock").exists() and not (cache / "k" / ".c.lock").exists()


def test_an_entry_being_filled_is_never_removed(cache, monkeypatch):
    source_cache("k", "old", filler([]))
    used_ago(cache / "k" / "old", 2 * IN_USE_GRACE_S)
    monkeypatch.setenv(BOUND_ENV, "0")
    seen: list[list[str]] = []

    def fill_while_evicting(directory: Path) -> None:
        (directory / "file.txt").write_text("x")
        used_ago(directory, 2 * IN_USE_GRACE_S)  # looks abandoned, but its key's lock is held
        source_cache("k", "other", filler([]))  # evicts what it may
        seen.append(entries(cache))

    source_cache("k", "new", fill_while_evicting)
    [during] = seen
    assert "old" not in during and any(name.startswith(".fill-new-") for name in during)
    assert entries(cache) == ["new", "other"]


@pytest.mark.parametrize("value", ["lots", "-1", "nan"])
def test_a_bound_that_is_not_a_number_of_gb_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(BOUND_ENV, value)
    with pytest.raises(ConfigError, match=f"{BOUND_ENV}='{value}': give the bound of the cached source directories in GB"):
        source_cache("k", "abc", filler([]))


@pytest.mark.parametrize(("kind", "key"), [("k", "../escape"), ("k", ".hidden"), ("a/b", "abc"), ("k", "")])
def test_a_kind_or_key_that_is_not_one_plain_name_is_refused(kind, key):
    with pytest.raises(ValueError, match="source_cache: "):
        source_cache(kind, key, filler([]))
