"""What only the local backend can meet: links, FIFOs and devices where an object should be, and in-place edits."""

import os
import stat
import threading
import time

import pytest

from factory.errors import ArtifactError, ConfigError
from factory.storage import open_store
from factory.storage.local import LocalStore

REFUSAL_TIMEOUT_S = 30
"""A refusal is immediate; a read that blocked or read /dev/zero would not end within this (the test fails, not hangs)."""


def refused(call) -> str:
    """Run `call` on a daemon thread and return the ArtifactError it raised; fail if it blocks or returns."""
    outcome: list[BaseException | object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as e:  # noqa: BLE001  (handed to the test thread, which asserts on it)
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(REFUSAL_TIMEOUT_S)
    assert outcome, f"still running after {REFUSAL_TIMEOUT_S} s: it blocked, or is reading something endless"
    assert isinstance(outcome[0], ArtifactError), f"not refused: {outcome[0]!r}"
    return str(outcome[0])


@pytest.fixture
def store(tmp_path) -> LocalStore:
    local = LocalStore(tmp_path / "store")
    local.put("manifests/ok.json", b"{}")
    return local


def every_read(store: LocalStore, key: str) -> list:
    return [lambda: store.get(key, limit=1 << 20), lambda: store.stat(key), lambda: store.open_read(key)]


def test_a_symlink_to_dev_zero_is_refused_unread(store):
    os.symlink("/dev/zero", store.root / "manifests" / "zero.json")
    for call in every_read(store, "manifests/zero.json"):
        assert "a symlink, not a regular file: refused" in refused(call)


def test_a_fifo_is_refused_without_blocking(store):
    os.mkfifo(store.root / "manifests" / "fifo.json")
    for call in every_read(store, "manifests/fifo.json"):
        assert "a FIFO, not a regular file: refused" in refused(call)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_a_device_node_is_refused_unopened(store):
    os.mknod(store.root / "manifests" / "zero.json", 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers
    for call in every_read(store, "manifests/zero.json"):
        assert "a device, not a regular file: refused" in refused(call)


def test_a_sparse_file_past_the_limit_is_refused_before_reading(store):
    with open(store.root / "manifests" / "huge.json", "wb") as f:
        f.truncate(10 << 30)  # 10 GiB of holes: reading it would take long and fill memory
    assert "10737418240 bytes, more than the 1048576 this read takes: refused unread" in refused(
        lambda: store.get("manifests/huge.json", limit=1 << 20))


def test_a_symlinked_directory_inside_the_root_leads_nowhere(store, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text("{}")
    os.symlink(outside, store.root / "aliases")
    for call in [*every_read(store, "aliases/secret.json"), lambda: store.create("aliases/new.json", b"x"),
                 lambda: store.put("aliases/new.json", b"x"), lambda: store.list("aliases/")]:
        assert "aliases is a symlink or not a directory: refused" in refused(call)
    assert sorted(os.listdir(outside)) == ["secret.json"]


def test_objects_are_read_only_files_and_the_stores_own_files_are_not_listed(store, tmp_path):
    (tmp_path / "w").write_bytes(b"weights")
    store.upload("objects/d/w", tmp_path / "w", sha256="0" * 64)
    store.replace("manifests/ok.json", b"{ }", store.stat("manifests/ok.json").etag)
    os.symlink("/etc/passwd", store.root / "manifests" / "link.json")
    assert stat.S_IMODE(os.stat(store.root / "objects" / "d" / "w").st_mode) & 0o222 == 0
    assert any(name.startswith(".") for name in os.listdir(store.root / "objects" / "d"))  # lock and sha256 files
    assert store.list() == ["manifests/ok.json", "objects/d/w"]


def test_an_edit_in_place_with_its_mtime_put_back_changes_the_etag(store):
    path = store.root / "manifests" / "ok.json"
    before = store.stat("manifests/ok.json").etag
    info = os.stat(path)
    time.sleep(0.05)  # past the filesystem clock's tick, so that the ctime can differ (it is not a timing assertion)
    os.chmod(path, 0o644)
    path.write_bytes(b"[]")
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == info.st_mtime_ns and os.stat(path).st_size == info.st_size
    assert store.stat("manifests/ok.json").etag != before
    assert store.replace("manifests/ok.json", b"{ }", before) is None


def test_file_uris_and_plain_paths_open_the_local_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert open_store("relative/dir").root == tmp_path / "relative" / "dir"
    assert open_store(f"file://{tmp_path}/d").uri == (tmp_path / "d").as_uri()
    assert open_store(f"file://localhost{tmp_path}/d").root == tmp_path / "d"
    with pytest.raises(ConfigError, match="FACTORY_STORE=file://host/d: a file URI names an absolute local directory"):
        open_store("file://host/d")
    with pytest.raises(ConfigError, match=r"FACTORY_STORE=s3:bucket: .*scheme://.*\./s3:bucket"):
        open_store("s3:bucket")
    assert open_store("./s3:bucket").root == tmp_path / "s3:bucket"
