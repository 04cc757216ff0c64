"""The artifact store on a real directory: publish, lookup, sharing by content, and damage detection."""

from __future__ import annotations

import hashlib
import os
import sys
import json
import stat
from pathlib import Path

import pytest

from factory.errors import ArtifactError
from factory.registry import ArtifactStore, Manifest, Provenance

PROVENANCE = Provenance(experiment="tiny-code-lm", config_hash="0123456789abcdef", git_commit="f" * 40)
INPUTS = {"corpus": "c" * 64}
FILES = {"tokenizer.json": b'{"vocab": {}}\n', "stats/counts.txt": b"merges 1790\n"}


@pytest.fixture
def store(tmp_path) -> ArtifactStore:
    return ArtifactStore(tmp_path / "registry")


def manifest_file(store: ArtifactStore, fingerprint: str) -> Path:
    """Where the manifest of `fingerprint` is, its shard made: for a test that writes one by hand."""
    path = store.manifest_path(fingerprint)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def publish(store: ArtifactStore, fingerprint: str, files=FILES, summary=None) -> Manifest:
    """Stage `files` and publish them as a tokenizer artifact."""
    with store.staging() as out:
        for name, data in files.items():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_bytes(data)
        return store.publish(
            out,
            kind="tokenizer",
            fingerprint=fingerprint,
            config={"vocab_size": 2048},
            inputs=INPUTS,
            code="local:0123456789abcdef",
            provenance=PROVENANCE,
            summary=summary if summary is not None else {"vocab_size": 2048},
        )


def staged_leftovers(store: ArtifactStore) -> list[Path]:
    return list((store.root / "staging").iterdir())


def make_writable(path: Path) -> None:
    path.chmod(path.stat().st_mode | stat.S_IWUSR)


def test_publish_moves_staged_files_to_their_content_address(store):
    with store.staging() as out:
        (out / "tokenizer.json").write_bytes(FILES["tokenizer.json"])
        manifest = store.publish(
            out, kind="tokenizer", fingerprint="fp-a", config={"vocab_size": 2048}, inputs=INPUTS,
            code="local:0123456789abcdef", provenance=PROVENANCE, summary={},
        )
        assert not out.exists()
    target = store.root / "objects" / manifest.digest
    assert store.path(manifest.digest) == target
    assert (target / "tokenizer.json").read_bytes() == FILES["tokenizer.json"]
    assert staged_leftovers(store) == []


def test_manifest_records_hashes_and_provenance(store):
    manifest = publish(store, "fp-a")
    expected_files = {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)} for name, data in FILES.items()}
    assert manifest.files == expected_files
    on_disk = json.loads(store.manifest_path("fp-a").read_text())
    assert on_disk["files"] == expected_files
    assert on_disk["fingerprint"] == "fp-a"
    assert on_disk["digest"] == manifest.digest
    assert on_disk["inputs"] == INPUTS
    assert on_disk["git_commit"] == PROVENANCE.git_commit
    assert on_disk["config_hash"] == PROVENANCE.config_hash
    assert on_disk["experiment"] == "tiny-code-lm"
    assert on_disk["config"] == {"vocab_size": 2048}


def test_published_files_and_directories_are_read_only(store):
    manifest = publish(store, "fp-a")
    target = store.path(manifest.digest)
    paths = [target, *target.rglob("*")]
    assert {p.relative_to(target).as_posix() for p in paths} == {".", "tokenizer.json", "stats", "stats/counts.txt"}
    for path in paths:
        assert stat.S_IMODE(path.stat().st_mode) & 0o222 == 0, path


def test_lookup_misses_before_publish_and_hits_after(store):
    assert store.lookup("fp-a") is None
    manifest = publish(store, "fp-a")
    found = store.lookup("fp-a")
    assert found == manifest
    assert store.lookup("fp-b") is None


def test_identical_content_from_two_fingerprints_shares_one_object(store):
    first = publish(store, "fp-a")
    second = publish(store, "fp-b")
    assert first.digest == second.digest
    assert [p.name for p in (store.root / "objects").iterdir()] == [first.digest]
    assert store.lookup("fp-a").fingerprint == "fp-a"
    assert store.lookup("fp-b").fingerprint == "fp-b"
    assert staged_leftovers(store) == []


def test_different_content_or_names_give_different_digests(store):
    base = publish(store, "fp-a")
    other_bytes = publish(store, "fp-b", files={**FILES, "tokenizer.json": b"{}\n"})
    other_name = publish(store, "fp-c", files={"renamed.json": FILES["tokenizer.json"]})
    single = publish(store, "fp-d", files={"tokenizer.json": FILES["tokenizer.json"]})
    assert len({base.digest, other_bytes.digest, other_name.digest, single.digest}) == 4


def test_publishing_a_fingerprint_twice_keeps_the_first_manifest(store):
    first = publish(store, "fp-a", summary={"run": 1})
    manifest_path = store.manifest_path("fp-a")
    first_bytes = manifest_path.read_bytes()
    second = publish(store, "fp-a", files={"other.bin": b"different bytes"}, summary={"run": 2})
    assert second == first
    assert second.created == first.created and second.summary == {"run": 1}
    assert manifest_path.read_bytes() == first_bytes
    assert [p.name for p in (store.root / "objects").iterdir()] == [first.digest]
    assert staged_leftovers(store) == []


def test_a_corrupted_file_makes_lookup_miss(store):
    manifest = publish(store, "fp-a")
    victim = store.path(manifest.digest) / "tokenizer.json"
    make_writable(victim)
    data = victim.read_bytes()
    victim.write_bytes(data[:-2] + b"X\n")  # same size, different bytes
    assert victim.stat().st_size == manifest.files["tokenizer.json"]["bytes"]
    assert store.lookup("fp-a") is None


def test_a_truncated_file_makes_lookup_miss(store):
    manifest = publish(store, "fp-a")
    victim = store.path(manifest.digest) / "stats" / "counts.txt"
    make_writable(victim)
    victim.write_bytes(FILES["stats/counts.txt"][:3])
    assert store.lookup("fp-a") is None


def test_a_missing_file_makes_lookup_miss(store):
    manifest = publish(store, "fp-a")
    victim = store.path(manifest.digest) / "stats" / "counts.txt"
    make_writable(victim.parent)
    victim.unlink()
    assert store.lookup("fp-a") is None


def test_republishing_over_a_damaged_artifact_repairs_it(store):
    manifest = publish(store, "fp-a")
    victim = store.path(manifest.digest) / "tokenizer.json"
    make_writable(victim)
    victim.write_bytes(b"garbage")
    assert store.lookup("fp-a") is None
    again = publish(store, "fp-a")
    assert again.digest == manifest.digest
    assert victim.read_bytes() == FILES["tokenizer.json"]
    assert store.lookup("fp-a") is not None


def test_staging_is_removed_when_the_block_raises(store):
    with pytest.raises(RuntimeError, match="stage crashed"):
        with store.staging() as out:
            (out / "half-written.bin").write_bytes(b"partial")
            raise RuntimeError("stage crashed")
    assert not out.exists()
    assert staged_leftovers(store) == []
    assert not (store.root / "objects").exists() or list((store.root / "objects").iterdir()) == []


def test_publishing_an_empty_staging_directory_fails(store):
    with store.staging() as out:
        (out / "empty-subdir").mkdir()
        with pytest.raises(ArtifactError, match="staged no files"):
            store.publish(
                out, kind="tokenizer", fingerprint="fp-a", config={}, inputs={}, code="local:x",
                provenance=PROVENANCE, summary={},
            )
    assert store.lookup("fp-a") is None
    assert not store.manifest_path("fp-a").exists()


def test_open_returns_a_published_artifact_and_refuses_an_unknown_one(store):
    manifest = publish(store, "fp-a")
    assert store.open(manifest.digest) == store.path(manifest.digest)
    assert (store.open(manifest.digest) / "tokenizer.json").is_file()
    with pytest.raises(ArtifactError, match="not in the registry"):
        store.open("0" * 64)


def test_an_unreadable_manifest_is_an_artifact_error_and_a_lookup_miss(store, caplog):
    manifest_file(store, "fp-a").write_text("{not json")
    with pytest.raises(ArtifactError, match="unreadable"):
        store.read_manifest(store.manifest_path("fp-a"))
    assert store.lookup("fp-a") is None
    assert "fp-a.json" in caplog.text


@pytest.mark.parametrize(
    "garbage",
    ["{not json", "[1, 2]", '{"kind": "tokenizer"}', None],
    ids=["not-json", "not-an-object", "missing-keys", "wrong-types"],
)
def test_a_damaged_manifest_is_skipped_with_one_warning_naming_it(store, caplog, garbage):
    good = publish(store, "fp-a")
    if garbage is None:  # every key there, files of the wrong type
        garbage = json.dumps({**good.to_json(), "fingerprint": "fp-bad", "files": ["tokenizer.json"]})
    manifest_file(store, "fp-bad").write_text(garbage)
    assert [m.fingerprint for m in store.manifests()] == ["fp-a"]
    assert [m.fingerprint for m in store.manifests()] == ["fp-a"]
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "fp-bad.json" in r.getMessage()]
    assert len(warnings) == 1
    assert store.lookup("fp-bad") is None


def test_republishing_over_a_damaged_manifest_replaces_it(store):
    manifest_file(store, "fp-a").write_text("{not json")
    manifest = publish(store, "fp-a")
    assert store.lookup("fp-a") == manifest


def test_a_symlink_to_identical_bytes_is_damage_not_a_hit(store, tmp_path):
    manifest = publish(store, "fp-a")
    victim = store.path(manifest.digest) / "tokenizer.json"
    outside = tmp_path / "outside.json"
    outside.write_bytes(FILES["tokenizer.json"])
    make_writable(victim.parent)
    victim.unlink()
    victim.symlink_to(outside)
    assert store.lookup("fp-a") is None
    assert store.lookup("fp-a", rehash=True) is None


def test_a_symlinked_directory_inside_an_artifact_is_damage(store, tmp_path):
    manifest = publish(store, "fp-a")
    stats = store.path(manifest.digest) / "stats"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "counts.txt").write_bytes(FILES["stats/counts.txt"])
    make_writable(stats)
    make_writable(stats.parent)
    (stats / "counts.txt").unlink()
    stats.rmdir()
    stats.symlink_to(outside, target_is_directory=True)
    assert store.lookup("fp-a") is None


def test_repairing_an_artifact_never_changes_the_mode_of_a_symlinks_target(store, tmp_path):
    manifest = publish(store, "fp-a")
    victim = store.path(manifest.digest) / "tokenizer.json"
    outside = tmp_path / "outside.json"
    outside.write_bytes(FILES["tokenizer.json"])
    outside.chmod(0o444)
    make_writable(victim.parent)
    victim.unlink()
    victim.symlink_to(outside)
    victim.parent.chmod(0o555)
    again = publish(store, "fp-a")
    assert stat.S_IMODE(outside.stat().st_mode) == 0o444
    assert outside.read_bytes() == FILES["tokenizer.json"]
    assert not victim.is_symlink() and victim.read_bytes() == FILES["tokenizer.json"]
    assert store.lookup("fp-a") == again


def test_an_artifact_directory_replaced_by_a_link_is_a_miss_and_republishing_replaces_only_the_link(store, tmp_path):
    manifest = publish(store, "fp-a")
    base = store.path(manifest.digest)
    outside = tmp_path / "outside"
    (outside / "stats").mkdir(parents=True)
    for name, data in FILES.items():
        (outside / name).write_bytes(data)
        (outside / name).chmod(0o444)
    make_writable(base.parent)
    for path in sorted(base.rglob("*"), reverse=True):
        make_writable(path)
        path.rmdir() if path.is_dir() else path.unlink()
    make_writable(base)
    base.rmdir()
    base.symlink_to(outside, target_is_directory=True)
    assert store.lookup("fp-a") is None
    publish(store, "fp-a")
    assert not base.is_symlink() and store.lookup("fp-a", rehash=True) is not None
    assert {stat.S_IMODE((outside / name).stat().st_mode) for name in FILES} == {0o444}
    assert sorted(p.name for p in outside.rglob("*")) == ["counts.txt", "stats", "tokenizer.json"]


def test_a_stage_that_stages_a_symlink_is_refused(store, tmp_path):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"x")
    with store.staging() as out, pytest.raises(ArtifactError, match="symlink"):
        (out / "link.bin").symlink_to(outside)
        store.publish(out, kind="tokenizer", fingerprint="fp-a", config={}, inputs={}, code="c", provenance=PROVENANCE, summary={})


def test_manifests_lists_every_artifact_by_kind(store):
    publish(store, "fp-a")
    publish(store, "fp-b", files={"other.bin": b"x"})
    assert sorted(m.fingerprint for m in store.manifests()) == ["fp-a", "fp-b"]
    assert sorted(m.fingerprint for m in store.manifests("tokenizer")) == ["fp-a", "fp-b"]
    assert list(store.manifests("checkpoints")) == []


def test_metadata_puts_provenance_first_then_the_summary(store):
    manifest = publish(store, "fp-a", summary={"vocab_size": 2048, "merges": 1790})
    metadata = manifest.metadata()
    assert metadata["digest"] == manifest.digest
    assert metadata["fingerprint"] == "fp-a"
    assert metadata["git_commit"] == PROVENANCE.git_commit
    assert metadata["config_hash"] == PROVENANCE.config_hash
    assert metadata["produced_for"] == "tiny-code-lm"
    assert metadata["inputs"] == "corpus=" + "c" * 12
    assert metadata["summary/vocab_size"] == 2048 and metadata["summary/merges"] == 1790
    assert list(metadata)[:4] == ["digest", "fingerprint", "git_commit", "config_hash"]


def opened_files(action) -> list[str]:
    """The files `action()` opens in this process (seen by an audit hook: the interpreter's own record, not a stand-in)."""
    opened: list[str] = []
    watching = [True]

    def hook(event: str, args: tuple) -> None:
        if watching[0] and event == "open" and isinstance(args[0], (str, Path)):
            opened.append(str(args[0]))

    sys.addaudithook(hook)  # hooks cannot be removed: this one goes quiet after the action
    try:
        action()
    finally:
        watching[0] = False
    return opened


def test_an_unchanged_artifact_is_found_without_reading_its_files_again(store):
    manifest = publish(store, "fp-a")
    artifact = str(store.path(manifest.digest))
    store.lookup("fp-a")  # files written in the clock tick of the record are checked once more, then trusted
    reads = opened_files(lambda: store.lookup("fp-a"))
    assert [path for path in reads if path.startswith(artifact)] == []
    assert any(path.startswith(artifact) for path in opened_files(lambda: store.lookup("fp-a", rehash=True)))


def test_a_file_changed_in_the_same_clock_tick_as_its_record_is_hashed_again(store):
    manifest = publish(store, "fp-a")
    store.lookup("fp-a")
    victim = store.path(manifest.digest) / "tokenizer.json"
    before = victim.stat()
    record = store.root / "verified" / f"{manifest.digest}.json"
    os.utime(record, ns=(before.st_atime_ns, before.st_mtime_ns))  # the record looks written in the victim's tick
    make_writable(victim)
    victim.write_bytes(FILES["tokenizer.json"][:-2] + b"X\n")
    os.utime(victim, ns=(before.st_atime_ns, before.st_mtime_ns))  # and the change left no newer mtime
    assert store.lookup("fp-a") is None
