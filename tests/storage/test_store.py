"""The store's protocol, the same on both backends (a local directory, a prefix on a real S3 server)."""

import hashlib
import io
import os
import time

import pytest

from factory.errors import ArtifactError
from factory.storage import Blob, ObjectStore
from factory.storage.s3 import PART_BYTES

BAD_KEYS = ["", "/etc/passwd", "../outside", "a/../../outside", "a//b", "a/", "./a", "a/./b", ".~lock", "a/.~b.lock",
            "a\x00b", "a\nb", "x" * 1025]


def test_create_writes_only_where_nothing_is(store: ObjectStore):
    etag = store.create("manifests/a.json", b"first")
    assert etag is not None
    assert store.create("manifests/a.json", b"second") is None
    assert store.get("manifests/a.json", limit=100) == Blob(b"first", etag)


def test_replace_writes_only_over_the_version_it_names(store: ObjectStore):
    first = store.create("aliases/best", b"v1")
    second = store.replace("aliases/best", b"v2", first)
    assert second is not None and second != first
    assert store.replace("aliases/best", b"v3 from a writer that read v1", first) is None  # lost: v2 is there now
    blob = store.get("aliases/best", limit=100)
    assert (blob.data, blob.etag) == (b"v2", second)
    assert store.replace("aliases/none", b"x", second) is None  # no object: nothing to replace, nothing written
    assert store.get("aliases/none", limit=100) is None


def test_put_writes_whatever_is_there_and_each_version_has_its_own_etag(store: ObjectStore):
    etags = [store.put("leases/x", data) for data in (b"one", b"two", b"one")]
    assert len(set(etags)) >= 2 and etags[0] != etags[1] and etags[1] != etags[2]
    assert store.get("leases/x", limit=100).etag == etags[2]
    assert store.stat("leases/x").etag == etags[2]


def test_a_read_larger_than_its_limit_is_refused(store: ObjectStore):
    store.put("manifests/big.json", b"x" * 100)
    assert store.get("manifests/big.json", limit=100).data == b"x" * 100
    with pytest.raises(ArtifactError, match="100 bytes, more than the 99 this read takes: refused unread"):
        store.get("manifests/big.json", limit=99)
    assert store.get("manifests/absent.json", limit=99) is None


def test_stat_says_size_etag_and_when_written_without_a_sha256_nobody_recorded(store: ObjectStore):
    before = time.time()
    etag = store.put("a/b", b"12345")
    info = store.stat("a/b")
    assert (info.size, info.etag, info.sha256) == (5, etag, None)
    assert before - 2 <= info.modified <= time.time() + 2  # S3 stamps whole seconds, on the server's clock (this machine's)
    assert store.stat("a/c") is None


def test_a_listing_says_what_stat_says_of_each_object_without_asking_it(store: ObjectStore):
    store.put("work/f/one.pt", b"x" * 300)
    store.create("work/f/one.json", b"{}")
    store.put("work/g/two.pt", b"y")
    listed = store.listing("work/f/")
    assert list(listed) == ["work/f/one.json", "work/f/one.pt"]
    for key, entry in listed.items():
        info = store.stat(key)
        assert (entry.etag, entry.size) == (info.etag, info.size) and abs(entry.modified - info.modified) < 1  # S3: whole seconds either way
    assert store.versions("work/") == {key: entry.etag for key, entry in store.listing("work/").items()}


def test_upload_and_download_round_trip_a_file_in_parts_with_its_sha256(store: ObjectStore, tmp_path):
    source = tmp_path / "weights.bin"
    source.write_bytes(os.urandom(PART_BYTES + 1000))  # S3: two parts
    sha256 = hashlib.sha256(source.read_bytes()).hexdigest()
    etag = store.upload("objects/d/weights.bin", source, sha256=sha256)
    info = store.stat("objects/d/weights.bin")
    assert (info.size, info.etag, info.sha256) == (source.stat().st_size, etag, sha256)
    target = tmp_path / "out" / "weights.bin"
    store.download("objects/d/weights.bin", target)
    assert target.read_bytes() == source.read_bytes()
    assert os.listdir(target.parent) == ["weights.bin"]  # no temp file left beside it
    store.put("objects/d/weights.bin", b"other bytes")
    assert store.stat("objects/d/weights.bin").sha256 is None  # the recorded sha256 was the old version's


def test_download_of_an_absent_object_fails_and_leaves_no_file(store: ObjectStore, tmp_path):
    target = tmp_path / "out" / "absent.bin"
    with pytest.raises(ArtifactError, match="no such object"):
        store.download("objects/d/absent.bin", target)
    assert not target.parent.exists() or list(target.parent.iterdir()) == []


def test_upload_takes_a_sha256_of_64_hex_digits(store: ObjectStore, tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(ValueError, match="64 lowercase hex"):
        store.upload("f", tmp_path / "f", sha256="abc")


def test_open_read_streams_a_checkpoint_torch_loads_and_seeks(store: ObjectStore, tmp_path):
    import torch

    buffer = io.BytesIO()
    torch.save({"weight": torch.arange(4096, dtype=torch.float32)}, buffer)
    store.put("objects/c/model.pt", buffer.getvalue())
    with store.open_read("objects/c/model.pt") as f:
        assert torch.equal(torch.load(f, weights_only=True)["weight"], torch.arange(4096, dtype=torch.float32))
        f.seek(-10, io.SEEK_END)
        assert f.read() == buffer.getvalue()[-10:]
        f.seek(5)
        assert (f.tell(), f.read(7)) == (5, buffer.getvalue()[5:12])
    with pytest.raises(ArtifactError, match="no such object"):
        store.open_read("objects/c/absent.pt")


def test_list_gives_the_sorted_keys_that_start_with_a_prefix(store: ObjectStore):
    keys = ["manifests/b.json", "manifests/a.json", "manifests/ab/c.json", "objects/d1/x", "objects/d2/y/z", "top"]
    for key in keys:
        store.put(key, b"x")
    assert store.list() == sorted(keys)
    assert store.list("manifests/") == ["manifests/a.json", "manifests/ab/c.json", "manifests/b.json"]
    assert store.list("manifests/a") == ["manifests/a.json", "manifests/ab/c.json"]  # a string prefix, as S3's
    assert store.list("objects/d2") == ["objects/d2/y/z"]
    assert store.list("nothing/") == []
    with pytest.raises(ArtifactError):
        store.list("../")


def test_delete_removes_an_object_and_is_quiet_when_there_is_none(store: ObjectStore):
    store.put("leases/x", b"held")
    store.delete("leases/x")
    assert store.stat("leases/x") is None and store.list() == []
    store.delete("leases/x")
    assert store.create("leases/x", b"again") is not None  # gone for create too


@pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
def test_a_key_that_could_leave_the_store_is_refused_by_every_method(store: ObjectStore, key, tmp_path):
    (tmp_path / "file").write_bytes(b"x")
    calls = [lambda: store.get(key, limit=10), lambda: store.stat(key), lambda: store.create(key, b"x"),
             lambda: store.replace(key, b"x", "etag"), lambda: store.put(key, b"x"), lambda: store.delete(key),
             lambda: store.upload(key, tmp_path / "file", sha256="0" * 64), lambda: store.download(key, tmp_path / "out"),
             lambda: store.open_read(key)]
    for call in calls:
        with pytest.raises(ArtifactError, match="not a valid object key"):
            call()
    assert store.list() == []
    assert sorted(path.name for path in tmp_path.iterdir()) in (["file"], ["file", "store"])


def test_good_keys_are_taken(store: ObjectStore):
    keys = ["a", "manifests/" + "0" * 64 + ".json", "objects/d/data/part=1/x-y_z.parquet", "a.b/c..d", "ü/naïve"]
    for key in keys:
        store.put(key, key.encode())
    assert store.list() == sorted(keys)
    assert [store.get(key, limit=200).data for key in keys] == [key.encode() for key in keys]
