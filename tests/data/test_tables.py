"""Versioned dataset tables on a real sqlite Iceberg catalog: tags, reuse, immutability, time travel."""

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from factory.data.tables import last_named, missing_refs, parse_ref, read_version, reject_version, resolve, write_content, write_version
from factory.errors import ArtifactError, ConfigError
from tests.data.conftest import LOG, documents

TABLE = "filtered.code"


def test_versions_are_numbered_and_old_ones_stay_readable(catalog):
    first = write_version(catalog, TABLE, documents("code", {"a.py": "a = 1\n", "b.py": "b = 2\n"}), LOG)
    second = write_version(catalog, TABLE, documents("code", {"a.py": "a = 1\n", "c.py": "c = 3\n"}), LOG)
    assert (first.tag, second.tag) == ("v1", "v2")
    assert first.snapshot_id != second.snapshot_id
    old = read_version(catalog, TABLE, resolve(catalog, TABLE, "v1"))
    new = read_version(catalog, TABLE, resolve(catalog, TABLE, "v2"))
    assert old["path"].to_pylist() == sorted(old["path"].to_pylist())
    assert set(old["path"].to_pylist()) == {"a.py", "b.py"}
    assert set(new["path"].to_pylist()) == {"a.py", "c.py"}
    assert catalog.load_table(TABLE).current_snapshot().snapshot_id == second.snapshot_id


def test_the_same_content_is_one_version(catalog):
    texts = {"a.py": "a = 1\n", "b.py": "b = 2\n"}
    first = write_version(catalog, TABLE, documents("code", texts), LOG)
    again = write_version(catalog, TABLE, documents("code", dict(reversed(texts.items()))), LOG)
    assert again == first
    assert len(list(catalog.load_table(TABLE).snapshots())) == 1


def test_named_tags_are_immutable(catalog):
    release = write_version(catalog, TABLE, documents("code", {"a.py": "a = 1\n"}), LOG, tag="release-1")
    assert release.ref == f"{TABLE}@release-1"
    assert write_version(catalog, TABLE, documents("code", {"a.py": "a = 1\n"}), LOG, tag="release-1") == release
    with pytest.raises(ArtifactError, match="already names another version"):
        write_version(catalog, TABLE, documents("code", {"a.py": "a = 2\n"}), LOG, tag="release-1")
    assert set(read_version(catalog, TABLE, resolve(catalog, TABLE, "release-1"))["text"].to_pylist()) == {"a = 1\n"}


def test_missing_tables_and_tags_are_named(catalog):
    write_version(catalog, TABLE, documents("code", {"a.py": "a = 1\n"}), LOG)
    problems = missing_refs(catalog, [f"{TABLE}@v1", f"{TABLE}@v9", "filtered.nothing@v1"])
    assert len(problems) == 2
    assert "no version tagged 'v9'" in problems[0] and "v1" in problems[0]
    assert "filtered.nothing does not exist" in problems[1]
    with pytest.raises(ConfigError, match="namespace.table@tag"):
        parse_ref("filtered.code")


WRITER = """
import logging, sys
from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.tables import write_version
from tests.data.conftest import documents
catalog = open_catalog(CatalogConfig.local(sys.argv[1]))
for i in range(int(sys.argv[3])):
    version = write_version(catalog, "filtered.code", documents("code", {f"w{sys.argv[2]}.py": f"x = {i}\\n"}), logging.getLogger())
    print(version.content_tag)
"""


def test_concurrent_writers_lose_no_version(tmp_path):
    from factory.data.catalog import CatalogConfig, open_catalog

    root = str(tmp_path / "shared")
    open_catalog(CatalogConfig.local(root)).create_namespace_if_not_exists("filtered")
    repo = Path(__file__).resolve().parents[2]
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, root, str(w), "6"], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for w in range(2)
    ]
    outputs = [w.communicate(timeout=240) for w in writers]
    assert [w.returncode for w in writers] == [0, 0], [err for _, err in outputs]
    table = open_catalog(CatalogConfig.local(root)).load_table(TABLE)
    tags = [tag for out, _ in outputs for tag in out.split()]
    assert len(set(tags)) == 12
    assert all(table.snapshot_by_name(tag) is not None for tag in tags)
    versions = sorted(int(name[1:]) for name in table.refs() if name.startswith("v"))
    assert versions == list(range(1, 13)), "every version got its own number"


ON_ONE_CORE = """
import logging, os, sys
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
from pyiceberg.utils.concurrent import ExecutorFactory
from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.tables import write_version
from tests.data.conftest import documents
write_version(open_catalog(CatalogConfig.local(sys.argv[1])), "raw.code", documents("code", {"a.py": "a = 1\\n"}), logging.getLogger())
print(ExecutorFactory.get_or_create()._max_workers)
"""


def test_a_write_makes_no_more_data_files_at_once_than_the_cores_it_may_run_on(tmp_path):
    import os

    from factory.data.tables import WRITERS, writers

    repo = Path(__file__).resolve().parents[2]
    env = {name: value for name, value in os.environ.items() if name != "PYICEBERG_MAX_WORKERS"}
    done = subprocess.run([sys.executable, "-c", ON_ONE_CORE, str(tmp_path)], cwd=repo, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["1"]  # a process pinned to one core: one file at a time (the default would be WRITERS)
    assert writers() == min(WRITERS, len(os.sched_getaffinity(0)))


def test_a_namespace_another_writer_creates_at_the_same_moment_is_no_error(catalog, tmp_path):
    """Two writers each see no namespace `filtered`, then both create it: the second insert fails on the catalog's key."""
    from factory.data.catalog import CatalogConfig, open_catalog

    other = open_catalog(CatalogConfig.local(tmp_path / "catalog"))  # the same catalog, through another connection
    checked = catalog.namespace_exists

    def exists_until_the_other_writer_creates_it(namespace):
        found = checked(namespace)
        if not found:
            other.create_namespace(namespace)  # between this writer's check and its insert
        return found

    catalog.namespace_exists = exists_until_the_other_writer_creates_it
    version = write_version(catalog, TABLE, documents("code", {"a.py": "a = 1\n"}), LOG)
    assert version.tag == "v1" and catalog.namespace_exists("filtered")


def test_a_rejected_version_takes_no_number_and_names_the_last_one_that_passed(catalog):
    first = write_version(catalog, TABLE, documents("code", {"a.py": "a = 1\n"}), LOG, tag="gold")
    refused = reject_version(catalog, write_content(catalog, TABLE, documents("code", {"a.py": "a = 2\n"})), LOG)
    assert refused.tag == "rejected-" + refused.content_tag.removeprefix("content-")
    assert last_named(catalog, TABLE) == f"{TABLE}@gold"
    second = write_version(catalog, TABLE, documents("code", {"a.py": "a = 3\n"}), LOG)
    assert (first.tag, second.tag) == ("gold", "v1")
    assert last_named(catalog, TABLE) == f"{TABLE}@v1"
    assert last_named(catalog, TABLE, excluding=second.snapshot_id) == f"{TABLE}@gold"
    assert missing_refs(catalog, [first.ref, second.ref]) == []
    assert "rejected" in missing_refs(catalog, [refused.ref])[0]
    with pytest.raises(ArtifactError, match=r"its tags: gold, v1$"):
        resolve(catalog, TABLE, "v9")


def test_pyicebergs_writer_submits_a_few_files_ahead_not_the_whole_stream(catalog):
    """pyiceberg turns a stream into data files through its executor's `map`; the one a write gives it submits a few items
    ahead of the result asked for (`Executor.map` takes the whole iterable at once: a whole stream in memory), and a
    table made before the write properties gets them at its next write."""
    from pyiceberg.utils.concurrent import ExecutorFactory

    from factory.data.documents import document_schemas
    from factory.data.tables import WRITE_PROPERTIES, ensure_namespace

    ensure_namespace(catalog, "raw")
    catalog.create_table("raw.old", schema=document_schemas(())[1])  # pyiceberg's 512 MB files
    write_version(catalog, "raw.old", documents("code", {"a.py": "a = 1\n"}), LOG)
    assert WRITE_PROPERTIES.items() <= catalog.load_table("raw.old").properties.items()
    executor = ExecutorFactory.get_or_create()
    release, pulled, results = threading.Event(), [], []

    def items():
        for n in range(50):
            pulled.append(n)
            yield n

    mapped = executor.map(lambda n: release.wait(60) and n, items())
    assert pulled == []  # nothing taken before the first result is asked for
    consumer = threading.Thread(target=lambda: results.extend(mapped))
    consumer.start()
    deadline = time.monotonic() + 30
    while len(pulled) <= executor._max_workers and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # room to run ahead, were it not bounded
    assert len(pulled) == executor._max_workers + 1, pulled
    release.set()
    consumer.join(60)
    assert results == list(range(50))
