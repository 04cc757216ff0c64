"""The registry's index of its manifests (`factory/registry/index.py`): listings come from it, it follows every
change of the manifests, a damaged index is rebuilt with a warning, and deleting it loses nothing."""

import hashlib
import itertools
import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from factory.registry import ArtifactStore
from factory.registry.index import FINE_RACY_NS, INDEX_NAME, RACY_NS, SHARD, racy_ns, shard_of
from tests.registry.test_store import manifest_file, publish

REPO = Path(__file__).resolve().parents[2]
OPENED: list[str] = []
"""Files opened while `opened_files` records (an audit hook: Python's own record of every `open`)."""
_RECORDING = [False]


def _audit(event: str, args: tuple) -> None:
    if _RECORDING[0] and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)


def opened_files(action) -> list[str]:
    """The files opened while `action()` runs."""
    OPENED.clear()
    _RECORDING[0] = True
    try:
        action()
    finally:
        _RECORDING[0] = False
    return list(OPENED)


def manifests_read(opened: list[str]) -> list[str]:
    """The manifest files among `opened` (a shard listed again is opened too: its directory, not its files)."""
    return [path for path in opened if "/manifests/" in path and path.endswith(".json")]


def listing(store: ArtifactStore, kind: str | None = None) -> list[tuple[str, str]]:
    return [(m.fingerprint, m.digest) for m in store.manifests(kind)]


@pytest.fixture
def store(tmp_path) -> ArtifactStore:
    return ArtifactStore(tmp_path / "registry")


def test_a_listing_is_the_manifests_and_a_second_one_opens_no_manifest_file(store):
    published = sorted((m.fingerprint, m.digest) for m in (publish(store, f"fp-{i}", files={"a.bin": bytes([i])}) for i in range(5)))
    assert listing(store) == published == listing(store, "tokenizer") and listing(store, "pretrain") == []
    assert (store.root / INDEX_NAME).is_file()
    opened = opened_files(lambda: listing(store))
    assert not manifests_read(opened), opened


def test_the_index_follows_manifests_published_removed_and_replaced(store):
    publish(store, "fp-a")
    assert [f for f, _ in listing(store)] == ["fp-a"]
    publish(store, "fp-b", files={"b.bin": b"b"})
    assert [f for f, _ in listing(store)] == ["fp-a", "fp-b"]
    store.manifest_path("fp-a").unlink()
    assert [f for f, _ in listing(store)] == ["fp-b"]
    manifest_file(store, "fp-c").write_text("{not json")  # damaged: left out, then repaired by publishing
    assert [f for f, _ in listing(store)] == ["fp-b"]
    repaired = publish(store, "fp-c", files={"c.bin": b"c"})
    assert listing(store) == [("fp-b", listing(store)[0][1]), ("fp-c", repaired.digest)]

    # a manifest written over in place (the same inode) changes no entry of its shard: the next listing of the shard, after
    # its next change, sees its other version and reads it again (published manifests are never written so)
    manifest = store.manifest_path("fp-b")
    other = json.loads(store.manifest_path("fp-c").read_text())
    with open(manifest, "r+") as f:  # same inode, other bytes
        f.truncate(0)
        f.write(json.dumps({**other, "fingerprint": "fp-b"}))
    neighbour = next(name for i in itertools.count() if shard_of(name := f"fp-d{i}") == shard_of("fp-b"))
    later = publish(store, neighbour, files={"d.bin": b"d"})  # a change of fp-b's shard
    assert listing(store) == [("fp-b", repaired.digest), ("fp-c", repaired.digest), (neighbour, later.digest)]


def test_a_new_manifest_lists_its_shard_alone(store):
    """The manifests lie in 256 shards; after one more is published, a listing lists (opens) its shard and no other."""
    for i in range(20):
        publish(store, f"fp-{i}", files={"a.bin": bytes([i])})
    time.sleep(FINE_RACY_NS * 2 / 1e9)  # past the clock's tick: what the next listing records of each shard is trusted
    assert len(listing(store)) == 20
    new = publish(store, "fp-new", files={"a.bin": b"new"})
    shards = {Path(path).name for path in opened_files(lambda: listing(store)) if Path(path).parent.name == "manifests"}
    assert shards == {shard_of("fp-new")}
    assert ("fp-new", new.digest) in listing(store) and len(listing(store)) == 21
    assert store.manifest_path("fp-new") == store.root / "manifests" / shard_of("fp-new") / "fp-new.json"


def test_a_registry_written_before_shards_is_read_and_moved_into_them(store, caplog):
    """Manifests at `manifests/<fingerprint>.json` (as the factory wrote them before shards) are found, listed, moved into
    their shards by the next listing, and one that pointed at a damaged artifact is replaced by its shard's."""
    kept, damaged = publish(store, "fp-kept"), publish(store, "fp-damaged", files={"d.bin": b"d"})
    for manifest in (kept, damaged):  # back where they were before shards
        os.rename(store.manifest_path(manifest.fingerprint), store.root / "manifests" / f"{manifest.fingerprint}.json")
    assert store.lookup("fp-kept") == kept
    os.chmod(store.path(damaged.digest), 0o755)
    (store.path(damaged.digest) / "d.bin").chmod(0o644)
    (store.path(damaged.digest) / "d.bin").write_bytes(b"e")
    assert store.lookup("fp-damaged") is None
    repaired = publish(store, "fp-damaged", files={"d.bin": b"d"})
    assert not (store.root / "manifests" / "fp-damaged.json").exists() and store.lookup("fp-damaged") == repaired

    (store.root / "manifests" / "naïve name.json").write_text("{}")  # not a registry name: damage, moved too
    assert SHARD.fullmatch(shard_of(os.fsdecode(b"\xff")))  # a listed name of bytes no encoding decodes has a shard too
    caplog.set_level(logging.INFO, "factory.registry.index")
    assert listing(store) == [("fp-damaged", repaired.digest), ("fp-kept", kept.digest)]
    assert not list((store.root / "manifests").glob("*.json")) and store.manifest_path("fp-kept").is_file()
    assert f"moved 2 manifests of {store.root / 'manifests'} into their shards" in caplog.text
    assert store.lookup("fp-kept") == kept and [path.name for path in store.manifest_paths()] == ["fp-damaged.json", "fp-kept.json", "naïve name.json"]


def test_a_manifest_in_another_shard_than_its_fingerprints_is_damage(store):
    """A copy of a manifest in every other shard: none of them hides the manifest, each is damage to `verify`."""
    good = publish(store, "fp-a")
    strays = [store.root / "manifests" / f"{i:02x}" / "fp-a.json" for i in range(256) if f"{i:02x}" != shard_of("fp-a")]
    for stray in strays:
        stray.parent.mkdir(exist_ok=True)
        stray.write_bytes(store.manifest_path("fp-a").read_bytes())
    assert listing(store) == [("fp-a", good.digest)] and store.lookup("fp-a") == good
    damage = store.verify()
    assert [d.path for d in damage] == [str(stray) for stray in strays]
    assert f"it is in shard '00', its fingerprint's is {shard_of('fp-a')!r}" in damage[0].problem
    store.manifest_path("fp-a").unlink()
    assert listing(store) == [] and store.lookup("fp-a") is None


def test_a_listing_is_trusted_after_the_clock_tick_of_the_file_system_that_stamped_the_change():
    assert racy_ns(1_700_000_000_000_000_000) == RACY_NS  # whole seconds: FAT, some network file systems
    assert racy_ns(1_700_000_000_123_456_789) == FINE_RACY_NS < RACY_NS


def test_the_state_of_the_index_changes_with_the_manifests_it_holds_and_only_then(store):
    index = store.index()
    empty = index.state()
    publish(store, "fp-a")
    one = index.state()
    assert one != empty and index.state() == one and store.index().state() == one  # read again, nothing changed
    publish(store, "fp-b", files={"b.bin": b"b"})
    two = index.state()
    store.manifest_path("fp-b").unlink()
    assert len({empty, one, two, index.state()}) == 4  # back to fp-a alone is another state: the token never goes back
    index.drop()
    assert index.state() not in {empty, one, two}  # an index built again is another index


@pytest.mark.parametrize("damage", ["garbage", "truncated", "not-a-manifest", "other-schema"])
def test_a_damaged_index_is_rebuilt_from_the_manifests_with_a_warning(store, caplog, damage):
    published = [(m.fingerprint, m.digest) for m in (publish(store, f"fp-{i}", files={"a.bin": bytes([i])}) for i in range(3))]
    assert listing(store) == published
    index = store.root / INDEX_NAME
    if damage == "garbage":
        index.write_bytes(b"this is not a database" * 100)
    elif damage == "truncated":
        index.write_bytes(index.read_bytes()[: index.stat().st_size // 2])
    else:
        import sqlite3

        with sqlite3.connect(index) as db:
            if damage == "not-a-manifest":
                db.execute("UPDATE manifests SET body = ? WHERE name = 'fp-1'", (json.dumps({"kind": "tokenizer"}),))
            else:
                db.execute("UPDATE meta SET value = 99 WHERE key = 'schema'")
    caplog.set_level("INFO")
    assert listing(store) == published
    said = "INFO" if damage == "other-schema" else "WARNING"  # another version's index is no damage: said, not warned
    assert any("index" in r.getMessage() and "again" in r.getMessage() for r in caplog.records if r.levelname == said), caplog.text
    assert listing(store) == published


def test_an_index_of_its_own_that_a_query_names_and_the_file_lacks_is_damage_built_again(store, caplog):
    import sqlite3

    from factory.registry import Provenance
    from factory.registry.index import Where

    def made(fingerprint: str, inputs: dict[str, str]) -> str:
        with store.staging() as out:
            (out / "x.bin").write_text(fingerprint)
            return store.publish(out, kind="pretrain", fingerprint=fingerprint, config={}, inputs=inputs, code="local:0", summary={},
                                 provenance=Provenance(experiment="e", config_hash="0" * 16, git_commit="f" * 40)).digest

    first = made("first", {})
    made("second", {"base": made("middle", {"base": first})})
    assert [m.fingerprint for m in store.manifests(where=Where(descends_from=first))] == ["middle", "second"]
    with sqlite3.connect(store.root / INDEX_NAME) as db:  # the index descent reads each digest from (`manifests_rows`)
        db.execute("DROP INDEX manifests_rows")
    assert [m.fingerprint for m in store.manifests(where=Where(descends_from=first))] == ["middle", "second"]
    assert "is damaged (no such index: manifests_rows): building it again" in caplog.text
    opened = opened_files(lambda: store.manifests(where=Where(descends_from=first)))
    assert not [path for path in opened if "/manifests/" in path], "built again, the index answers the descent itself"


def test_deleting_the_index_loses_nothing_and_a_registry_that_cannot_hold_one_still_lists(store):
    published = [(m.fingerprint, m.digest) for m in (publish(store, f"fp-{i}", files={"a.bin": bytes([i])}) for i in range(3))]
    assert listing(store) == published
    (store.root / INDEX_NAME).unlink()
    assert listing(store) == published
    (store.root / INDEX_NAME).unlink()
    (store.root / INDEX_NAME).mkdir()  # no file can be made there: the manifests are read themselves
    assert listing(store) == published


WRITER = textwrap.dedent(
    """
    import sys
    from factory.registry import ArtifactStore
    from tests.registry.test_store import publish
    store, name, count = ArtifactStore(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    for i in range(count):
        publish(store, f"{name}-{i}", files={"a.bin": f"{name}{i}".encode()})
        seen = {m.fingerprint for m in store.manifests()}
        assert {f"{name}-{j}" for j in range(i + 1)} <= seen, (i, sorted(seen))
    """
)


def test_two_processes_publishing_and_listing_at_once_lose_nothing(store):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(store.root), name, "25"], env=env, stderr=subprocess.PIPE, text=True)
               for name in ("left", "right")]
    for writer in writers:
        assert writer.wait(timeout=120) == 0, writer.stderr.read()
    assert sorted(f for f, _ in listing(store)) == sorted(f"{name}-{i}" for name in ("left", "right") for i in range(25))


def test_queries_of_the_index_answer_as_the_manifests_read_one_by_one_do(store):
    """Each condition a listing can ask (`Where`), from the index and from the files (an index that cannot be made),
    on a small graph: two experiments, a pretrain run each, a model of one, an evaluation of both runs, a fine-tune of the
    model, and an artifact of the other experiment with the fine-tune's bytes (one digest, made from something else).
    The index answers each without reading a manifest: a query SQLite refuses would fall back to reading them all."""
    from factory.registry import Provenance
    from factory.registry.index import Where

    def made(fingerprint: str, kind: str, experiment: str, inputs: dict[str, str], content: str = "") -> str:
        with store.staging() as out:
            (out / "x.bin").write_text(content or fingerprint)
            return store.publish(out, kind=kind, fingerprint=fingerprint, config={}, inputs=inputs, code="local:0", summary={},
                                 provenance=Provenance(experiment=experiment, config_hash="0" * 16, git_commit="f" * 40)).digest

    a, b = made("run-a", "pretrain", "exp-a", {}), made("run-b", "pretrain", "exp-b", {})
    model = made("model-a", "model", "exp-a", {"pretrain": a})
    made("eval-ab", "evaluations", "exp-a", {"left": a, "right": b})
    tuned = made("sft-a", "sft", "exp-a", {"base": model})
    assert made("same-bytes-b", "sft", "exp-b", {"base": b}, content="sft-a") == tuned
    asked = {"every": (None, Where()), "digest": (None, Where(digest=model)), "prefix": (None, Where(digest_prefix=a[:8])),
             "experiment": (None, Where(experiment="exp-a")), "models of exp-a": ("model", Where(experiment="exp-a")),
             "made from a": (None, Where(made_from=a)), "made from b": (None, Where(made_from=b)),
             "evaluations made from b": ("evaluations", Where(made_from=b)), "nothing": ("model", Where(made_from=b)),
             "holding model-a's file": (None, Where(file_sha256=hashlib.sha256(b"model-a").hexdigest())),
             "descending from a": (None, Where(descends_from=a)), "sft descending from b": ("sft", Where(descends_from=b)),
             "descending from the fine-tune": (None, Where(descends_from=tuned)), "run-a": (None, Where(fingerprint="run-a")),
             "sft of the bytes b made": ("sft", Where(digest=tuned, fingerprint="same-bytes-b"))}
    newest = {"newest 2": (None, Where(), 2), "newest pretrain of exp-b": ("pretrain", Where(experiment="exp-b"), 1)}

    def answers() -> dict[str, list[str]]:
        return ({name: [m.fingerprint for m in store.manifests(kind, where)] for name, (kind, where) in asked.items()}
                | {name: [m.fingerprint for m in store.manifests(kind, where, newest=n)] for name, (kind, where, n) in newest.items()})

    list(store.manifests())  # the index built
    indexed: dict[str, list[str]] = {}
    opened = opened_files(lambda: indexed.update(answers()))
    assert not manifests_read(opened), "every condition is answered by the index, no manifest read"
    assert indexed["made from a"] == ["eval-ab", "model-a"] and indexed["models of exp-a"] == ["model-a"] and indexed["nothing"] == []
    assert indexed["holding model-a's file"] == ["model-a"] and indexed["newest pretrain of exp-b"] == ["run-b"]
    assert indexed["descending from a"] == ["eval-ab", "model-a", "sft-a"] and indexed["sft descending from b"] == ["same-bytes-b"]
    assert indexed["descending from the fine-tune"] == []
    assert indexed["run-a"] == ["run-a"] and indexed["sft of the bytes b made"] == ["same-bytes-b"]
    created = {m.fingerprint: m.created for m in store.manifests()}
    assert indexed["newest 2"] == sorted(created, key=lambda f: (created[f], f), reverse=True)[:2]
    (store.root / INDEX_NAME).unlink()
    (store.root / INDEX_NAME).mkdir()
    assert answers() == indexed
    with pytest.raises(ValueError, match="not hex digits"):
        list(store.manifests(where=Where(digest_prefix="a%")))
    state = store.index().state()
    with pytest.raises(ValueError, match="not a string"):  # a caller's mistake, not damage: the index is not built again
        list(store.manifests(where=Where(digest=[a])))
    assert store.index().state() == state

    # `factory lineage` walks the graph by these queries: it opens no manifest file once the index holds them
    from factory.ops.lineage import Lineage

    (store.root / INDEX_NAME).rmdir()
    list(store.manifests())
    answers: dict = {}
    opened = opened_files(lambda: answers.update(up=Lineage(store).upstream(model), down=Lineage(store).downstream(a)))
    assert not manifests_read(opened), opened
    assert [node["digest"] for node in answers["up"]["from"]] == [a]
    assert sorted(node["kind"] for node in answers["down"]["to"]) == ["evaluations", "model"]


def test_the_rows_a_walk_reads_are_what_the_manifests_say_from_the_index_or_without_one(store, caplog):
    """`rows()` (what `factory registry gc` walks, from the index's columns) gives what each manifest says: its size, its
    inputs' digests sorted, the model its `from:` started from, the checkpoint an evaluation scored; a damaged row gets
    the index built again, and a registry that cannot hold one gives the same rows from the files."""
    import sqlite3

    from factory.registry import Provenance
    from factory.registry.index import ManifestRow

    def made(fingerprint: str, kind: str, inputs: dict[str, str], summary: dict, base: dict | None = None, size: int = 3) -> str:
        with store.staging() as out:
            (out / "x.bin").write_bytes(fingerprint.encode()[:1] * size)
            (out / "y.bin").write_bytes(b"y" * size)
            return store.publish(out, kind=kind, fingerprint=fingerprint, config={}, inputs=inputs, code="local:0", summary=summary,
                                 provenance=Provenance(experiment="exp", config_hash="0" * 16, git_commit="f" * 40, base=base or {})).digest

    run = made("run", "pretrain", {}, {"steps": 1})
    model = made("model", "model", {"pretrain": run}, {}, size=5)
    scored = made("scored", "evaluations", {"z": model, "a": run}, {"training": run, "score": 1.0})
    tuned = made("tuned", "sft", {"base": model}, {"training": 7}, base={"model": model, "from": "other.md"})
    huge = {**next(store.manifests()).to_json(), "fingerprint": "huge", "files": {"x.bin": {"sha256": "0" * 64, "bytes": 2**63}}}
    manifest_file(store, "huge").write_text(json.dumps(huge))  # more than the index's integers hold: damaged, skipped
    expected = [ManifestRow.of_body(m.to_json()) for m in store.manifests()]
    rows = store.rows()
    assert rows == expected
    by = {row.fingerprint: row for row in rows}
    assert by["model"].size == 10 and by["scored"].inputs == tuple(sorted([model, run])) and by["scored"].training == run
    assert by["tuned"].base_model == model and by["tuned"].training is None and by["run"].inputs == () and by["tuned"].digest == tuned
    assert by["scored"].digest == scored and [row.fingerprint for row in rows] == sorted(by) and "huge" not in by

    with sqlite3.connect(store.root / INDEX_NAME) as db:
        db.execute("UPDATE manifests SET size = 'many' WHERE name = 'model'")
    assert store.rows() == expected
    assert any("damaged" in r.getMessage() for r in caplog.records if r.levelname == "WARNING"), caplog.text
    (store.root / INDEX_NAME).unlink()
    (store.root / INDEX_NAME).mkdir()  # no index can be kept: the files themselves
    assert store.rows() == expected


HOSTILE = textwrap.dedent(
    """
    import sys
    from factory.registry import ArtifactStore
    print(sorted(m.fingerprint for m in ArtifactStore(sys.argv[1]).manifests()))
    """
)


@pytest.mark.parametrize("thing", ["fifo", "link-to-dev-zero", "fifo-journal"])
def test_a_fifo_or_a_link_where_the_index_belongs_is_replaced_never_waited_on(store, thing):
    publish(store, "fp-a")
    index = store.root / INDEX_NAME
    if thing == "fifo":
        os.mkfifo(index)
    elif thing == "link-to-dev-zero":
        index.symlink_to("/dev/zero")
    else:
        os.mkfifo(f"{index}-journal")
    done = subprocess.run([sys.executable, "-c", HOSTILE, str(store.root)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0 and done.stdout.strip() == "['fp-a']", done.stderr
    assert "is not a regular file" in done.stderr
    assert Path("/dev/zero").is_char_device()


def test_changes_since_a_state_are_what_came_in_and_what_went_and_none_for_another_index_or_too_old_a_state(store, monkeypatch):
    from factory.registry import index as index_module

    publish(store, "fp-kept", files={"a.bin": b"kept"})
    publish(store, "fp-gone", files={"a.bin": b"gone"})
    since = store.index().state()
    assert store.index().changes(since) == (since, [])
    publish(store, "fp-new", files={"a.bin": b"new"})
    store.manifest_path("fp-gone").unlink()
    replaced = json.loads(store.manifest_path("fp-kept").read_text()) | {"summary": {"vocab_size": 1}}
    aside = store.manifest_path("fp-kept").with_suffix(".new")
    aside.write_text(json.dumps(replaced))
    os.replace(aside, store.manifest_path("fp-kept"))  # renamed over, as a repair writes: another version of the file
    now, changed = store.index().changes(since)
    assert now == store.index().state() != since
    assert sorted((body["fingerprint"], body["summary"]["vocab_size"]) for body in changed) == [
        ("fp-gone", 2048), ("fp-kept", 1), ("fp-kept", 2048), ("fp-new", 2048)]  # a replaced one: both versions
    assert store.index().changes(now) == (now, [])
    assert store.index().changes(f"0-{now.partition('-')[2]}") is None  # another index's state
    assert store.index().changes(f"{now.partition('-')[0]}-x") is None
    monkeypatch.setattr(index_module, "KEEP_GENERATIONS", 1)
    for i in range(100):  # to the next hundredth generation, where the dropped rows of old ones go
        publish(store, f"fp-{i}", files={"a.bin": f"{i}".encode()})
        if store.index().state().endswith("00"):
            break
    assert store.index().changes(since) is None and store.index().changes(store.index().state())[1] == []
