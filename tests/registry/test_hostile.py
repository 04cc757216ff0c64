"""The registry against hostile files: each case is a probe that once hung, ran out of memory, crashed, served bytes it
should not, or wrote outside the registry. Damage is a warning naming the file, a cache miss or a takeover.

Each probe that could hang or fill memory runs in a child process with a memory cap and a time limit, so the old
behaviour fails the test instead of the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from factory.errors import ArtifactError
from factory.registry import ArtifactStore
from factory.registry.aliases import standing
from factory.registry.lease import hold, read_holder
from tests.registry.test_store import FILES, manifest_file, publish

BOUNDED = textwrap.dedent(
    """
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31))  # 2 GiB: reading /dev/zero whole fails fast
    from factory.registry import ArtifactStore
    from factory.registry.aliases import standing
    from factory.errors import ArtifactError
    store = ArtifactStore(sys.argv[1])
    print("lookup", store.lookup(sys.argv[2]) is not None)
    print("holder", store.holder(sys.argv[2]))
    print("manifests", sorted(m.fingerprint for m in store.manifests()))
    print("damaged", sorted(d.path.rsplit("/", 1)[1] for d in store.verify()))
    print("ref", store.ref("latest"))
    try:
        print("standing", standing(store, "production").model)
    except ArtifactError as e:
        print("refused", e)
    """
)


def probe(store: ArtifactStore, fingerprint: str) -> dict[str, str]:
    """What the registry's readers say about `fingerprint`, asked by a child process that may use at most 2 GiB and
    30 s; each answer by its first word."""
    done = subprocess.run([sys.executable, "-c", BOUNDED, str(store.root), fingerprint], capture_output=True, text=True,
                          timeout=30, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return dict(line.split(" ", 1) for line in done.stdout.splitlines())


def plant(path: Path, thing: str) -> None:
    """Put something hostile where a registry file belongs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    if thing == "link-to-dev-zero":
        path.symlink_to("/dev/zero")
    elif thing == "fifo":
        os.mkfifo(path)
    elif thing == "directory":
        path.mkdir()
    elif thing == "huge":
        with open(path, "wb") as f:
            f.truncate(1 << 30)  # a sparse GiB of zero bytes
    elif thing == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    else:
        raise AssertionError(thing)


THINGS = ["link-to-dev-zero", "fifo", "directory", "huge", "deep"]


@pytest.mark.parametrize("thing", THINGS)
def test_a_hostile_manifest_is_a_skipped_miss_and_damage_not_a_hang(tmp_path, thing):
    store = ArtifactStore(tmp_path / "registry")
    good = publish(store, "fp-good")
    plant(store.manifest_path("fp-bad"), thing)
    said = probe(store, "fp-bad")
    assert said["lookup"] == "False"
    assert said["manifests"] == "['fp-good']"
    assert said["damaged"] == "['fp-bad.json']"
    assert store.lookup(good.fingerprint) == good


@pytest.mark.parametrize("thing", THINGS)
def test_a_hostile_lease_is_a_damaged_holder_that_is_taken_over(tmp_path, thing):
    store = ArtifactStore(tmp_path / "registry")
    lease = store.root / "leases" / "fp-a.lease"
    plant(lease, thing)
    said = probe(store, "fp-a")
    assert said["holder"].startswith("Holder(owner='an unreadable lease")
    with hold(lease, "me", stale_after_s=0.2, poll_s=0.05):
        holder = read_holder(lease)
        assert holder is not None and holder.owner == "me" and not holder.damage
    assert os.listdir(lease.parent) == []  # nothing left behind, no `*.released`


@pytest.mark.parametrize("record", [
    {"pid": 10**30}, {"pid": -1}, {"beat": int("9" * 400)}, {"beat": 1e308 * 10}, {"pid": True},
], ids=["pid-1e30", "pid-negative", "beat-400-digits", "beat-infinite", "pid-bool"])
def test_a_lease_with_numbers_no_process_or_clock_has_is_damage(tmp_path, record):
    lease = tmp_path / "fp-a.lease"
    fields = {"owner": "x", "token": "t", "host": "h", "pid": 1, "beat": 1.0, **record}
    lease.write_text(json.dumps(fields).replace("Infinity", "1e999"))
    holder = read_holder(lease)
    assert holder is not None and holder.damage, holder
    with hold(lease, "me", stale_after_s=0.2, poll_s=0.05):
        assert read_holder(lease).owner == "me"


@pytest.mark.parametrize("thing", THINGS)
def test_hostile_stamps_are_ignored_and_the_files_hashed_again(tmp_path, thing):
    store = ArtifactStore(tmp_path / "registry")
    good = publish(store, "fp-a")
    plant(store.root / "verified" / f"{good.digest}.json", thing)
    said = probe(store, "fp-a")
    assert said["lookup"] == "True" and said["damaged"] == "[]"


@pytest.mark.parametrize("thing", THINGS)
def test_a_hostile_promotion_record_is_refused_naming_it(tmp_path, thing):
    store = ArtifactStore(tmp_path / "registry")
    plant(store.root / "history" / "promotions" / "production" / "000001.json", thing)
    said = probe(store, "fp-a")
    assert said["refused"].startswith(f"history record {store.root}/history/promotions/production/000001.json is damaged")


def test_a_hostile_ref_names_nothing(tmp_path):
    store = ArtifactStore(tmp_path / "registry")
    good = publish(store, "fp-a")
    store.set_ref("latest", good.digest)
    assert store.ref("latest") == good.digest
    for thing in ("link-to-dev-zero", "fifo", "huge"):
        plant(store.root / "refs" / "latest", thing)
        assert probe(store, "fp-a")["ref"] == "None"
    (store.root / "refs" / "latest").unlink()
    (store.root / "refs" / "latest").write_text("../../../etc")
    assert store.ref("latest") is None
    with pytest.raises(ArtifactError, match="not a registry name"):
        store.ref("../escape")


@pytest.mark.parametrize("field,value", [
    ("digest", "../../victim"), ("digest", "/"), ("fingerprint", "../x"),
    ("files", {"../../outside.txt": {"sha256": "0" * 64, "bytes": 1}}), ("files", {"/etc/passwd": {"sha256": "0" * 64, "bytes": 1}}),
    ("inputs", {"corpus": "../../victim"}),
], ids=["digest-up", "digest-root", "fingerprint-up", "file-up", "file-absolute", "input-up"])
def test_a_manifest_naming_paths_outside_the_registry_is_damage_and_nothing_is_read_or_written_there(tmp_path, field, value):
    store = ArtifactStore(tmp_path / "registry")
    good = publish(store, "fp-a")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "tokenizer.json").write_bytes(FILES["tokenizer.json"])
    path = store.manifest_path("fp-a")
    path.chmod(0o600)
    path.write_text(json.dumps({**good.to_json(), field: value}))
    assert store.lookup("fp-a") is None
    assert [d.path for d in store.verify()] == [str(path)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["registry", "victim"]
    assert sorted(p.name for p in victim.iterdir()) == ["tokenizer.json"]
    with pytest.raises(ArtifactError, match="not an artifact digest"):
        store.open("../../victim")


def test_a_manifest_copied_under_another_fingerprint_is_damage(tmp_path):
    store = ArtifactStore(tmp_path / "registry")
    good = publish(store, "fp-a")
    manifest_file(store, "fp-b").write_text(json.dumps(good.to_json()))
    assert store.lookup("fp-b") is None
    assert store.lookup("fp-a") == good


def test_a_byte_changed_with_its_mtime_restored_is_a_miss(tmp_path):
    store = ArtifactStore(tmp_path / "registry")
    good = publish(store, "fp-a")
    assert store.lookup("fp-a") == good  # stamps recorded
    target = store.path(good.digest) / "tokenizer.json"
    before = os.stat(target)
    target.chmod(0o644)
    data = bytearray(target.read_bytes())
    data[0] ^= 0x01
    target.write_bytes(bytes(data))
    target.chmod(before.st_mode)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))  # as `touch -d` would: size and mtime as recorded
    assert os.stat(target).st_size == before.st_size and os.stat(target).st_mtime_ns == before.st_mtime_ns
    assert store.lookup("fp-a") is None


def test_standing_reads_the_history_it_wrote(tmp_path):
    """The bounded reader still reads what the factory writes."""
    from factory.registry.aliases import history

    history(ArtifactStore(tmp_path), "production").append({"action": "promote", "model": "a" * 64})
    assert standing(ArtifactStore(tmp_path), "production").model == "a" * 64
