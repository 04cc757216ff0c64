"""The registry in an object store, on local disk and on a real S3 server process (moto's, `tests/s3server.py`):
publishing without rename, two publishers of one fingerprint, damage found from the store's metadata, leases by
conditional writes, and a server that goes away in the middle of a publish."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from factory.errors import ArtifactError, ConfigError, FactoryError
from factory.registry.objects import ObjectRegistry
from factory.registry.store import Provenance
from factory.storage import ObjectStore, open_store
from tests.s3server import running_s3

ROOT = Path(__file__).parents[2]
PROVENANCE = Provenance(experiment="tiny", config_hash="0123456789abcdef", git_commit="f" * 40)
FILES = {"tokenizer.json": b'{"vocab": {}}\n', "stats/counts.txt": b"merges 1790\n"}


@pytest.fixture(scope="module")
def s3():
    with running_s3() as server:
        yield server


@pytest.fixture(params=["file", "s3"])
def location(request, tmp_path) -> tuple[str, dict[str, str]]:
    """Where a test's store is, and the environment a process needs to reach it."""
    if request.param == "file":
        return str(tmp_path / "store"), {}
    server = request.getfixturevalue("s3")
    return f"s3://{server.bucket}/{uuid.uuid4().hex[:12]}", server.env()


@pytest.fixture
def registry(location, tmp_path, monkeypatch) -> ObjectRegistry:
    for name, value in location[1].items():
        monkeypatch.setenv(name, value)
    return ObjectRegistry(open_store(location[0]), tmp_path / "local")


def publish(registry: ObjectRegistry, fingerprint: str, files=FILES, run_id: str = "") -> object:
    with registry.staging() as out:
        for name, data in files.items():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_bytes(data)
        return registry.publish(out, kind="tokenizer", fingerprint=fingerprint, config={"vocab_size": 2048},
                                inputs={"corpus": "c" * 64}, code="local:0123456789abcdef",
                                provenance=dataclasses.replace(PROVENANCE, run_id=run_id),
                                summary={})


def test_one_file_of_an_artifact_is_read_alone_checked_against_its_sha256(registry, location, s3):
    """`read`: a reader of one small file of an artifact fetches that object only (no local copy of the rest); a file
    the artifact does not have is None; one changed in the store is an error naming it, never its bytes."""
    manifest = publish(registry, "fp-a", files={**FILES, "big.bin": os.urandom(1 << 16)})
    assert registry.read(manifest, "stats/counts.txt") == FILES["stats/counts.txt"]
    assert registry.read(manifest, "no-such-file.txt") is None
    if location[0].startswith("s3://"):
        assert not (registry.root / "cache").exists()  # nothing copied: big.bin was not fetched
        assert not [path for path in s3.reads() if path.endswith("/big.bin")]
        key = f"objects/{manifest.digest}/tokenizer.json"
        registry.store.put(key, b'{"vocab": []}\n')  # as long as the original, so only its sha256 tells
        with pytest.raises(ArtifactError, match=rf"artifact {manifest.digest[:12]} in s3://\S+: tokenizer.json is damaged; rerun its stage"):
            registry.read(manifest, "tokenizer.json")


def test_one_checkpoint_of_an_artifact_is_fetched_alone_file_or_directory(registry, location, s3):
    """`fetch`: an evaluation of one checkpoint gets that file (or a sharded one's directory) on local disk, checked,
    without the rest of the artifact; fetched once; a damaged object is an error naming it, never a local copy."""
    files = {"step_000100.pt": os.urandom(4096), "step_000200/__0_0.distcp": b"shard 0", "step_000200/.metadata": b"meta",
             "big.bin": os.urandom(1 << 16)}
    manifest = publish(registry, "fp-a", files=files)
    single, sharded = registry.fetch(manifest, "step_000100.pt"), registry.fetch(manifest, "step_000200")
    assert single.read_bytes() == files["step_000100.pt"]
    assert {p.name: p.read_bytes() for p in sharded.iterdir()} == {"__0_0.distcp": b"shard 0", ".metadata": b"meta"}
    assert not registry.fetch(manifest, "step_000300.pt").exists()
    if location[0].startswith("s3://"):
        reads = s3.reads()
        assert not [path for path in reads if path.endswith("/big.bin")] and not (registry.root / "cache" / "objects").exists()
        assert registry.fetch(manifest, "step_000100.pt") == single and s3.reads() == reads  # from the cache, no request
        other = publish(registry, "fp-b", files={"step_000100.pt": os.urandom(4096)})
        registry.store.put(f"objects/{other.digest}/step_000100.pt", os.urandom(4096))
        with pytest.raises(ArtifactError, match=rf"artifact {other.digest[:12]} in s3://\S+: step_000100.pt is damaged"):
            registry.fetch(other, "step_000100.pt")
        assert not (registry.root / "cache" / "parts" / other.digest / "step_000100.pt").exists()


def test_a_tokenizer_is_fetched_with_the_files_read_beside_it_and_nothing_else(registry):
    """`fetched_tokenizer`: the tokenizer file, its config (the end-of-text token) and an imported tokenizer's token ids
    (the export writes them into the model's configs) land in one directory; a model's weights beside them do not."""
    from factory.models.tokenizer import fetched_tokenizer

    files = {"tokenizer.json": b'{"t": 1}', "tokenizer_config.json": b'{"eos_token": "</s>"}', "token_ids.json": b'{"config.json": {}}',
             "model.pt": os.urandom(1 << 16)}
    manifest = publish(registry, "fp-tok", files=files)
    found = fetched_tokenizer(registry, manifest)
    assert found.name == "tokenizer.json"
    assert {p.name: p.read_bytes() for p in found.parent.iterdir()} == {name: data for name, data in files.items() if name != "model.pt"}
    bare = publish(registry, "fp-bare", files={"tokenizer.json": b'{"t": 2}'})  # no config: the tokenizer alone
    assert fetched_tokenizer(registry, bare).read_bytes() == b'{"t": 2}'
    weights = publish(registry, "fp-weights", files={"model.pt": b"w"})  # no tokenizer: a message naming the artifact
    with pytest.raises(ArtifactError, match=f"artifact {weights.digest[:12]} has no tokenizer.json: rerun its stage"):
        fetched_tokenizer(registry, weights)


def test_an_artifact_is_its_objects_and_then_its_manifest_and_reads_back_verified(registry):
    assert registry.lookup("fp-a") is None
    manifest = publish(registry, "fp-a")
    keys = registry.store.list()
    assert [k for k in keys if k.startswith("objects/")] == [f"objects/{manifest.digest}/{name}" for name in sorted(FILES)]
    assert "manifests/fp-a.json" in keys
    assert registry.lookup("fp-a") == manifest
    copy = registry.open(manifest.digest)
    assert {p.relative_to(copy).as_posix(): p.read_bytes() for p in copy.rglob("*") if p.is_file()} == FILES
    assert publish(registry, "fp-a") == manifest  # the first manifest for a fingerprint stands


PUBLISHER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from factory.registry.objects import ObjectRegistry
    from factory.storage import open_store
    from tests.registry.test_objects import publish
    location, local, go, name = sys.argv[1:]
    registry = ObjectRegistry(open_store(location), local)
    while not Path(go).exists():
        time.sleep(0.005)
    manifest = publish(registry, "fp-race", run_id=name)
    print(json.dumps({"digest": manifest.digest, "run_id": manifest.run_id}))
    """
)


def test_two_processes_publishing_one_fingerprint_at_once_make_one_artifact_and_both_name_it(location, tmp_path):
    uri, env = location
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", PUBLISHER, uri, str(tmp_path / name), str(go), name],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                              env={**os.environ, **env, "PYTHONPATH": str(ROOT)}) for name in ("first", "second")]
    time.sleep(1.0)  # both are importing, then waiting for `go`
    go.touch()
    said = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        said.append(json.loads(out))
    assert said[0] == said[1]  # one digest, and the manifest of the one that won, for both
    assert said[0]["run_id"] in ("first", "second")
    for name, value in env.items():
        os.environ[name] = value
    store = open_store(uri)
    assert [k for k in store.list("manifests/")] == ["manifests/fp-race.json"]


def test_a_changed_or_deleted_object_is_a_miss_and_publishing_again_repairs_it(registry):
    manifest = publish(registry, "fp-a")
    key = f"objects/{manifest.digest}/tokenizer.json"
    original = FILES["tokenizer.json"]
    registry.store.put(key, bytes([original[0] ^ 1]) + original[1:])  # same size, one byte changed
    assert registry.lookup("fp-a") is None
    assert registry.damage(manifest) == ["tokenizer.json: sha256 differs from the manifest's"]
    assert publish(registry, "fp-a") == manifest
    assert registry.lookup("fp-a") == manifest and registry.lookup("fp-a", rehash=True) == manifest
    registry.store.delete(key)
    assert registry.lookup("fp-a") is None
    assert publish(registry, "fp-a") == manifest
    assert registry.open(manifest.digest).joinpath("tokenizer.json").read_bytes() == original


def test_a_damaged_manifest_is_a_miss_and_publishing_again_replaces_it(registry):
    registry.store.put("manifests/fp-a.json", b'{"kind": ')
    assert registry.lookup("fp-a") is None and list(registry.manifests()) == []
    manifest = publish(registry, "fp-a")
    assert registry.lookup("fp-a") == manifest and [m.fingerprint for m in registry.manifests()] == ["fp-a"]


def test_listings_come_from_a_local_index_that_follows_the_store(registry, location, request, tmp_path):
    """A second listing reads no manifest again (on S3: no GET of one, as the server counts them); a manifest removed,
    damaged or published again in the store shows in the next listing, and a reader elsewhere lists the same."""
    publish(registry, "fp-a")
    publish(registry, "fp-b", files={"other.bin": b"x"})
    assert [m.fingerprint for m in registry.manifests()] == ["fp-a", "fp-b"]
    if location[0].startswith("s3://"):
        server = request.getfixturevalue("s3")
        before = server.reads()
        assert [m.fingerprint for m in registry.manifests("tokenizer")] == ["fp-a", "fp-b"]
        reread = {path: count for path, count in server.reads().items() if "/manifests/" in path and count != before.get(path, 0)}
        assert not reread, reread
    registry.store.delete("manifests/fp-a.json")
    assert [m.fingerprint for m in registry.manifests()] == ["fp-b"]
    registry.store.put("manifests/fp-b.json", b'{"kind": ')
    assert list(registry.manifests()) == []
    again = publish(registry, "fp-b", files={"other.bin": b"x"})
    assert list(registry.manifests()) == [again]
    elsewhere = ObjectRegistry(registry.store, tmp_path / "elsewhere")
    assert list(elsewhere.manifests("tokenizer")) == [again] and list(elsewhere.manifests("model")) == []


def test_a_reader_with_a_digest_finds_its_manifest_without_listing_the_store(registry, location, request, tmp_path):
    """`manifest_of` on a machine with no index yet (a new pod): the fingerprint its publisher wrote beside the digest
    names the manifest (on S3: two GETs, as the server counts them), no index is built; a pointer that is missing, names
    another artifact's manifest or nothing readable is a hint only (the index answers), and removing the artifact
    removes it."""
    from factory.registry.store import manifest_of

    first = publish(registry, "fp-a")
    other = publish(registry, "fp-b", files={"other.bin": b"x"})
    fresh = ObjectRegistry(registry.store, tmp_path / "fresh")
    before = request.getfixturevalue("s3").reads() if location[0].startswith("s3://") else None
    assert manifest_of(fresh, first.digest) == first
    if before is not None:
        read = {path.split("/", 2)[-1] for path, count in request.getfixturevalue("s3").reads().items() if count != before.get(path, 0)}
        assert {key.rsplit("/", 2)[-2] + "/" + key.rsplit("/", 1)[-1] for key in read} == {f"digests/{first.digest}", "manifests/fp-a.json"}
    assert not list((tmp_path / "fresh").glob("index-*"))  # no listing of every manifest
    for hint in (b"fp-b", b"no-such-fingerprint", b"../manifests/fp-a"):
        registry.store.put(f"digests/{first.digest}", hint)
        assert manifest_of(fresh, first.digest) == first
    registry.store.delete(f"digests/{first.digest}")
    assert manifest_of(fresh, first.digest) == first  # published before pointers: the index
    same = publish(registry, "fp-c")  # the same bytes under another fingerprint: its pointer, until it is removed
    assert same.digest == first.digest and registry.store.get(f"digests/{first.digest}", limit=100).data == b"fp-c"
    assert registry.remove(same) == 0 and manifest_of(fresh, first.digest) == first
    assert registry.store.get(f"digests/{first.digest}", limit=100).data == b"fp-a"  # pointed again at one that stays
    assert registry.remove(first) > 0 and registry.store.get(f"digests/{first.digest}", limit=100) is None
    with pytest.raises(ArtifactError, match=f"artifact {first.digest[:12]} is not in the registry"):
        manifest_of(fresh, first.digest)
    assert manifest_of(fresh, other.digest) == other


def test_a_manifest_naming_paths_outside_is_damage(registry):
    manifest = publish(registry, "fp-a")
    registry.store.put("manifests/fp-b.json", json.dumps({**manifest.to_json(), "fingerprint": "fp-b", "digest": "../x"}).encode())
    assert registry.lookup("fp-b") is None
    with pytest.raises(FactoryError, match="not an artifact digest"):
        registry.open("../x")


HOLDER = textwrap.dedent(
    """
    import sys, time
    from factory.registry.objects import ObjectRegistry
    from factory.storage import open_store
    registry = ObjectRegistry(open_store(sys.argv[1]), sys.argv[2])
    with registry.lease("fp-a", sys.argv[3]):
        print("holding", flush=True)
        time.sleep(float(sys.argv[4]))
    """
)


def holding(location, tmp_path, owner: str, seconds: float) -> subprocess.Popen:
    """A process that holds the lease on fp-a for `seconds`, started once it says so."""
    uri, env = location
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, uri, str(tmp_path / owner), owner, str(seconds)],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, **env, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline() == "holding\n"
    return proc


def test_a_lease_whose_holder_was_killed_is_taken_over(registry, location, tmp_path):
    victim = holding(location, tmp_path, "victim", 600)
    assert registry.holder("fp-a").owner == "victim"
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    taken = []
    with registry.lease("fp-a", "me", on_takeover=taken.append, poll_s=0.05):
        assert registry.holder("fp-a").owner == "me"
    assert [h.owner for h in taken] == ["victim"]
    assert registry.holder("fp-a") is None


def test_a_waiter_is_told_who_holds_the_lease_and_gets_it_when_it_is_released(registry, location, tmp_path):
    other = holding(location, tmp_path, "teammate", 1.5)
    waited = []
    with registry.lease("fp-a", "me", on_wait=waited.append, poll_s=0.05):
        assert registry.holder("fp-a").owner == "me"
        assert other.wait(timeout=60) == 0  # it released the lease as its block ended
    assert [h.owner for h in waited] == ["teammate"]


def test_a_heartbeat_keeps_a_lease_and_a_taken_over_one_stops_beating(registry):
    key = "leases/fp-a.lease"
    with registry.lease("fp-a", "me", heartbeat_s=0.05):
        first = registry.store.get(key, limit=1 << 16).etag
        deadline = time.monotonic() + 30
        while registry.store.get(key, limit=1 << 16).etag == first and time.monotonic() < deadline:
            time.sleep(0.02)
        assert registry.store.get(key, limit=1 << 16).etag != first  # renewed by a conditional write
    assert registry.holder("fp-a") is None


def test_a_lease_write_whose_answer_was_lost_is_known_as_its_own(s3, tmp_path, monkeypatch):
    """A conditional write carried out but answered 500 is sent again and refused: the lease it wrote is still its
    writer's (the create that takes it, the heartbeat that keeps it), not a teammate's to wait for or yield to."""
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    registry = ObjectRegistry(open_store(f"s3://{s3.bucket}/{uuid.uuid4().hex[:12]}"), tmp_path / "local")
    key = "leases/fp-a.lease"
    s3.lose_replies(1)
    with registry.lease("fp-a", "me", heartbeat_s=0.05, wait=False):  # LeaseBusy if it took its own lease for another's
        assert registry.holder("fp-a").owner == "me"
        s3.lose_replies(1)  # a renewal's
        beats, etag, deadline = 0, registry.store.get(key, limit=1 << 16).etag, time.monotonic() + 30
        while beats < 3 and time.monotonic() < deadline:
            if (now := registry.store.get(key, limit=1 << 16).etag) != etag:
                beats, etag = beats + 1, now
            time.sleep(0.02)
        assert beats == 3, "the heartbeat stopped at the renewal whose answer was lost"
    assert registry.holder("fp-a") is None


def test_a_history_record_whose_answer_was_lost_is_written_once(s3, tmp_path, monkeypatch):
    """A promotion's create carried out but answered 500 is sent again and refused: the record is there once, under the
    number the append returns, not again under the next."""
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    registry = ObjectRegistry(open_store(f"s3://{s3.bucket}/{uuid.uuid4().hex[:12]}"), tmp_path / "local")
    history = registry.history("promotions/production")
    assert history.append({"action": "promote", "by": "me", "at": "then"}) == 1
    s3.lose_replies(1)
    assert history.append({"action": "demote", "by": "me", "at": "now"}) == 2
    assert [(r["seq"], r["action"]) for r in history.records()] == [(1, "promote"), (2, "demote")]


def test_two_waiters_at_one_abandoned_lease_never_both_hold_it(registry):
    registry.store.put("leases/fp-a.lease", b"garbage")  # unreadable: abandoned once unchanged for 0.5 s
    inside, most, lock = [0], [0], threading.Lock()

    def worker(name: str) -> None:
        with registry.lease("fp-a", name, stale_after_s=0.5, poll_s=0.01):
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            time.sleep(0.2)
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert most[0] == 1


def test_the_server_going_away_in_the_middle_of_a_publish_leaves_no_manifest_and_the_rerun_succeeds(tmp_path, monkeypatch):
    with running_s3() as server:
        for name, value in {**server.env(), "FACTORY_STORE_OUTAGE_S": "0.5"}.items():  # gone for longer than the store waits
            monkeypatch.setenv(name, value)
        registry = ObjectRegistry(open_store(server.url), tmp_path / "local")
        big = {f"part-{i}.bin": os.urandom(1 << 20) for i in range(24)}
        cut = threading.Timer(0.0, server.kill)
        uploaded = []
        original = registry.store.upload

        def upload(key, path, *, sha256):  # the server goes away once the first object is in
            if uploaded:
                cut.run()
            uploaded.append(key)
            return original(key, path, sha256=sha256)

        monkeypatch.setattr(registry.store, "upload", upload)
        with pytest.raises(FactoryError):
            publish(registry, "fp-big", files=big)
        monkeypatch.setattr(registry.store, "upload", original)
        server.restart()
        assert registry.store.list("manifests/") == [] and registry.lookup("fp-big") is None
        assert len([k for k in registry.store.list("objects/")]) == 1  # what got in before the cut, named by no manifest
        manifest = publish(registry, "fp-big", files=big)
        assert registry.lookup("fp-big", rehash=True) == manifest


def test_a_store_another_factory_wrote_with_a_newer_layout_is_refused_naming_the_setting(location, tmp_path, monkeypatch):
    for name, value in location[1].items():
        monkeypatch.setenv(name, value)
    store = open_store(location[0])
    ObjectRegistry(store, tmp_path / "local")
    assert json.loads(store.get("layout.json", limit=100).data) == {"layout": 1}
    ObjectRegistry(store, tmp_path / "local")  # its own layout: opens again
    store.put("layout.json", b'{"layout": 2}')
    with pytest.raises(ConfigError, match=r"^FACTORY_STORE=.*: written by a newer factory \(layout 2; this one reads layout 1\)"):
        ObjectRegistry(store, tmp_path / "local")
    store.put("layout.json", b"[")
    with pytest.raises(ConfigError, match="layout.json is unreadable"):
        ObjectRegistry(store, tmp_path / "local")


def test_local_copies_beyond_the_cache_bound_go_least_recently_used_first(registry, monkeypatch):
    monkeypatch.setenv("FACTORY_STORE_CACHE_GB", str(2.5 / 1024))  # 2.5 MiB: room for two copies of 1 MiB
    monkeypatch.setattr("factory.registry.objects.CACHE_GRACE_S", 0.0)
    digests = [publish(registry, f"fp-{i}", files={"weights.bin": os.urandom(1 << 20)}).digest for i in range(3)]
    first, second = registry.open(digests[0]), registry.open(digests[1])
    os.utime(first, (time.time() - 60, time.time() - 60))
    os.utime(second, (time.time() - 30, time.time() - 30))
    registry.open(digests[0])  # used again: now the most recent of the two
    third = registry.open(digests[2])
    assert first.is_dir() and third.is_dir() and not second.exists()
    assert registry.open(digests[1]).joinpath("weights.bin").stat().st_size == 1 << 20  # fetched again when asked


def test_fetched_checkpoints_count_in_the_cache_bound_and_go_least_recently_used_first(registry, monkeypatch):
    monkeypatch.setenv("FACTORY_STORE_CACHE_GB", str(2.5 / 1024))  # 2.5 MiB: room for two checkpoints of 1 MiB
    monkeypatch.setattr("factory.registry.objects.CACHE_GRACE_S", 0.0)
    manifests = [publish(registry, f"fp-{i}", files={"step_000001.pt": os.urandom(1 << 20)}) for i in range(3)]
    first, second = (registry.fetch(manifest, "step_000001.pt") for manifest in manifests[:2])
    os.utime(first.parent, (time.time() - 60, time.time() - 60))
    os.utime(second.parent, (time.time() - 30, time.time() - 30))
    registry.fetch(manifests[0], "step_000001.pt")  # used again: now the most recent of the two
    third = registry.fetch(manifests[2], "step_000001.pt")
    assert first.is_file() and third.is_file() and not second.exists()
    assert registry.fetch(manifests[1], "step_000001.pt").stat().st_size == 1 << 20  # fetched again when asked


def test_promotions_are_records_in_the_store_that_two_writers_never_number_alike(registry):
    from factory.registry.aliases import history, known_aliases, standing

    model = publish(registry, "fp-model").digest
    assert standing(registry, "production").model is None and known_aliases(registry) == []
    seqs = []
    writers = [threading.Thread(target=lambda: seqs.append(history(registry, "production").append(
        {"action": "promote", "model": model}))) for _ in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=60)
    assert sorted(seqs) == [1, 2, 3, 4]
    assert standing(registry, "production").model == model and known_aliases(registry) == ["production"]
    assert [k for k in registry.store.list("history/")] == [f"history/promotions/production/{n:06d}.json" for n in range(1, 5)]
    registry.store.put("history/promotions/production/000002.json", b"[1")
    with pytest.raises(FactoryError, match="history record .*000002.json is damaged"):
        standing(registry, "production")


@pytest.mark.parametrize("value", ["lots", "-1", "nan", "inf"])
def test_a_cache_bound_that_is_no_number_is_refused_naming_it(registry, monkeypatch, value):
    """Not only words: a negative, NaN or infinite bound would empty the cache at every read, or never."""
    digest = publish(registry, "fp-a").digest
    monkeypatch.setenv("FACTORY_STORE_CACHE_GB", value)
    with pytest.raises(ConfigError, match=f"FACTORY_STORE_CACHE_GB='{value}': give the local copies' bound in GB"):
        registry.open(digest)


def test_where_an_artifact_is_shown_is_its_prefix_in_the_store_and_showing_it_fetches_nothing(registry):
    manifest = publish(registry, "fp-shown")
    assert registry.where(manifest.digest) == f"{registry.store.uri}/objects/{manifest.digest}"
    assert not (registry.root / "cache" / "objects" / manifest.digest).exists()  # `path` would have copied it here
    assert registry.path(manifest.digest).is_dir()
    with pytest.raises(ArtifactError, match="is not an artifact digest"):
        registry.where("../manifests")


def test_a_plugin_reads_the_newest_checkpoints_of_an_upstream_training_alone(registry, tmp_path):
    """`checkpoints_of(ctx, stage, last=2)` (the plugin API): every kept checkpoint listed from its record, the newest two
    on local disk and loadable, the older one not fetched, and no whole copy of the training artifact made."""
    import torch

    from factory.config.stages import StageSpec
    from factory.data.catalog import CatalogConfig
    from factory.plugin import checkpoints_of, load_weights
    from factory.runtime.context import StageContext
    from factory.runtime.report import ConsoleReporter
    from factory.runtime.request import StageRequest

    staged = tmp_path / "weights"
    staged.mkdir()
    files = {"run.json": b"{}"}
    for step in (10, 20, 30):
        torch.save({"model": {"w": torch.full((2,), float(step))}, "step": step}, staged / "w.pt")
        data = (staged / "w.pt").read_bytes()
        files[f"step_{step:06d}.pt"] = data
        files[f"step_{step:06d}.json"] = json.dumps({"step": step, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                                                      "metrics": {"loss": 1 / step}}).encode()
    training = publish(registry, "fp-pretrain", files=files)
    spec = StageSpec(kind="average", config={}, upstream={"pretrain": training.digest}, code="local:0")
    request = StageRequest(spec=spec, registry=str(tmp_path / "local"), catalog=CatalogConfig.local(tmp_path / "catalog"),
                           provenance=PROVENANCE)
    ctx = StageContext(request=request, registry=registry, out=tmp_path / "out", reporter=ConsoleReporter(logging.getLogger("test")))
    newest = checkpoints_of(ctx, "pretrain", last=2)
    assert [(c.step, c.metrics) for c in newest] == [(20, {"loss": 1 / 20}), (30, {"loss": 1 / 30})]
    assert [load_weights(c)["w"].tolist() for c in newest] == [[20.0, 20.0], [30.0, 30.0]]
    local = [p.name for p in (tmp_path / "local").rglob("step_*")]
    assert sorted(local) == ["step_000020.pt", "step_000030.pt"]
    assert not list((tmp_path / "local").rglob("run.json"))  # no whole copy of the training artifact
    assert [c.step for c in checkpoints_of(ctx, "pretrain")] == [10, 20, 30]
    with pytest.raises(ValueError, match="last must be 1 or more"):
        checkpoints_of(ctx, "pretrain", last=0)
