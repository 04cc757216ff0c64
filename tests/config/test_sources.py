"""What a source reads: its files' digests, the stamp cache that spares hashing them again, and the named changes."""

import hashlib
import json
import os
import time

import pytest

from factory.config.data_sections import SourceConfig
from factory.config.source_cache import CACHE_ENV
from factory.config.sources import changed_files, source_files


@pytest.fixture
def tree(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    root = tmp_path / "src"
    (root / "pkg").mkdir(parents=True)
    (root / "top.py").write_text("a = 1\n")
    (root / "pkg" / "mod.py").write_text("b = 2\n")
    (root / "notes.txt").write_text("not matched\n")
    (root / "big.py").write_text("c = 3\n" * 100)
    return root


def config(root, **overrides):
    return SourceConfig(**({"kind": "directory", "path": str(root), "max_file_bytes": 100} | overrides))


def test_the_listing_holds_each_matched_file_and_its_sha256(tree):
    listing = source_files(config(tree))
    assert dict(listing.files) == {
        "top.py": hashlib.sha256(b"a = 1\n").hexdigest(),
        "pkg/mod.py": hashlib.sha256(b"b = 2\n").hexdigest(),
        "big.py": "too_large:600",  # never read: it would be skipped
    }
    assert source_files(config(tree)).digest == listing.digest


def test_a_rewrite_of_the_same_size_and_mtime_is_still_seen(tree):
    before = source_files(config(tree))
    path = tree / "top.py"
    stat = path.stat()
    path.write_text("a = 9\n")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # only the ctime tells
    after = source_files(config(tree))
    assert after.digest != before.digest
    assert changed_files(before.files, after.files) == "1 changed (top.py)"


def test_unchanged_files_are_not_hashed_again(tree, tmp_path):
    source_files(config(tree))
    time.sleep(0.01)  # the stamps must be younger than the files' mtimes to be trusted
    source_files(config(tree))
    [stamps_path] = (tmp_path / "cache" / "sources").glob("*.json")
    stamps = json.loads(stamps_path.read_text())
    stamps["top.py"][5] = "f" * 64  # a hash only the cache could answer with
    stamps_path.write_text(json.dumps(stamps))
    assert source_files(config(tree)).files["top.py"] == "f" * 64


def test_a_damaged_stamp_cache_is_hashed_again(tree, tmp_path):
    first = source_files(config(tree))
    for path in (tmp_path / "cache" / "sources").glob("*.json"):
        path.write_text("{not json")
    assert source_files(config(tree)).digest == first.digest


def test_changes_are_named_and_long_lists_counted():
    old = {f"m{i}.py": "x" for i in range(3)}
    new = {**{f"m{i}.py": "y" for i in range(1, 3)}, **{f"n{i}.py": "z" for i in range(7)}}
    assert changed_files(old, new) == "7 added (n0.py, n1.py, n2.py, n3.py, n4.py, … 2 more), 2 changed (m1.py, m2.py), 1 removed (m0.py)"
    assert changed_files(old, old) == ""
