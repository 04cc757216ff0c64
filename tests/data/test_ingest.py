"""Raw ingest from real files under tmp_path: globs, skipped files by reason, jsonl records, stable ids."""

import hashlib
import json
import os
import re
from pathlib import Path

import pyarrow as pa
import pytest

from factory.config.data_sections import SourceConfig
from factory.data.documents import ARROW_SCHEMA, doc_id
from factory.config.source_kinds import glob_pattern
from factory.config.sources import source_root
from factory.data.ingest import SKIP_REASONS, read_documents
from factory.errors import ConfigError
from tests.data.conftest import LOG, ingest

MAX_FILE_BYTES = 1_000
RUNNING_AS_ROOT = os.geteuid() == 0


def write(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


@pytest.fixture
def tree(tmp_path) -> Path:
    """A source tree with good files and one bad file of each kind."""
    root = tmp_path / "src"
    write(
        root,
        {
            "top.py": b"import os\n",
            "pkg/mod.py": "def f():\n    return 'caf\u00e9'\n".encode(),
            "pkg/sub/deep.py": b"x = 1\n",
            "pkg/tests/test_mod.py": b"assert True\n",  # excluded
            "pkg/__pycache__/mod.py": b"cached = 1\n",  # caches are never read
            "notes.txt": b"not included\n",
            "binary.py": b"abc\x00def\n",
            "latin1.py": "# caf\u00e9\n".encode("latin-1"),
            "big.py": b"y = 2\n" * (MAX_FILE_BYTES // 6 + 1),
            "empty.py": b"",
            "locked.py": b"secret = 1\n",
        },
    )
    (root / "locked.py").chmod(0)
    yield root
    (root / "locked.py").chmod(0o644)


def config(root: Path, **overrides) -> SourceConfig:
    fields = {"kind": "directory", "path": str(root), "include": ("**/*.py",), "exclude": ("**/tests/**",)}
    fields["max_file_bytes"] = MAX_FILE_BYTES
    return SourceConfig(**(fields | overrides))


def test_text_files_are_read_with_globs_and_bad_files_counted(tree):
    result = ingest("code", config(tree), LOG)
    docs = result.documents
    expected = {"top.py", "pkg/mod.py", "pkg/sub/deep.py"} | ({"locked.py"} if RUNNING_AS_ROOT else set())
    assert docs.schema == ARROW_SCHEMA
    assert set(docs["path"].to_pylist()) == expected
    assert docs["id"].to_pylist() == sorted(docs["id"].to_pylist())
    assert result.files_read == len(expected)
    assert result.skipped == {
        "too_large": 1,
        "binary": 1,
        "not_utf8": 1,
        "unreadable": 0 if RUNNING_AS_ROOT else 1,
        "bad_json": 0,
        "bad_parquet": 0,
        "bad_arrow": 0,
        "empty": 1,
        "missing_column": 0,
        "wrong_type": 0,
    }
    row = {r["path"]: r for r in docs.to_pylist()}["pkg/mod.py"]
    text = "def f():\n    return 'caf\u00e9'\n"
    assert row == {
        "id": doc_id("code", "pkg/mod.py"),
        "source": "code",
        "path": "pkg/mod.py",
        "text": text,
        "bytes": len(text.encode()),
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "metadata": "{}",
    }


def test_unreadable_files_are_counted_not_fatal(tree):
    (tree / "dangling.py").symlink_to(tree / "gone.py")  # unreadable even for root
    os.mkfifo(tree / "pipe.py")  # reading it would block forever
    result = ingest("code", config(tree, include=("locked.py", "dangling.py", "pipe.py", "top.py")), LOG)
    if RUNNING_AS_ROOT:  # root reads a file with mode 000
        assert set(result.documents["path"].to_pylist()) == {"locked.py", "top.py"}
        assert result.skipped["unreadable"] == 2
    else:
        assert result.documents["path"].to_pylist() == ["top.py"]
        assert result.skipped["unreadable"] == 3


def test_include_is_relative_to_the_root_and_exclude_wins(tree):
    only_top = ingest("code", config(tree, include=("*.py",), exclude=("b*.py", "l*.py", "e*.py")), LOG)
    assert only_top.documents["path"].to_pylist() == ["top.py"]
    nested = ingest("code", config(tree, include=("pkg/**/*.py",), exclude=()), LOG)
    assert sorted(nested.documents["path"].to_pylist()) == ["pkg/mod.py", "pkg/sub/deep.py", "pkg/tests/test_mod.py"]


def test_glob_semantics():
    assert glob_pattern("**/*.py").fullmatch("top.py")
    assert glob_pattern("**/*.py").fullmatch("a/b/c.py")
    assert not glob_pattern("*.py").fullmatch("a/b.py")
    assert glob_pattern("[!t]*.py").fullmatch("mod.py")
    assert not glob_pattern("[!t]*.py").fullmatch("top.py")
    assert not glob_pattern("a?c").fullmatch("a/c")


def test_ids_are_stable_across_ingests(tree):
    first = ingest("code", config(tree), LOG).documents
    again = ingest("code", config(tree), LOG).documents
    assert first.equals(again)
    other_name = ingest("other", config(tree), LOG).documents
    assert set(other_name["id"].to_pylist()).isdisjoint(first["id"].to_pylist())


def test_jsonl_lines_become_documents_with_metadata(tmp_path):
    lines = [
        json.dumps({"text": "first doc", "lang": "en", "stars": 3}),
        "",
        "{not json",
        json.dumps({"body": "no text field"}),
        json.dumps({"text": 42}),
        json.dumps({"text": "second \u2028 doc", "b": 1, "a": [1, 2]}, ensure_ascii=False),
    ]
    write(tmp_path / "src", {"data/part.jsonl": "\n".join(lines).encode() + b"\n", "data/skip.txt": b"x"})
    result = ingest("web", config(tmp_path / "src", include=("**/*.jsonl",), format="jsonl"), LOG)
    rows = sorted(result.documents.to_pylist(), key=lambda r: r["path"])
    assert [(r["path"], r["text"], r["metadata"]) for r in rows] == [
        ("data/part.jsonl:1", "first doc", '{"lang": "en", "stars": 3}'),
        ("data/part.jsonl:6", "second \u2028 doc", '{"a": [1, 2], "b": 1}'),
    ]
    assert rows[0]["id"] == doc_id("web", "data/part.jsonl:1")
    assert result.skipped["bad_json"] == 3
    assert result.files_read == 1


def test_missing_or_file_roots_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"source\.path: .*found nothing"):
        source_root(SourceConfig(kind="directory", path=str(tmp_path / "nowhere")))
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ConfigError, match=r"source\.path: .*found a file"):
        ingest("code", SourceConfig(kind="directory", path=str(tmp_path / "file.txt")), LOG)


def test_stdlib_root_leaves_out_installed_packages():
    result = ingest("stdlib", SourceConfig(include=("json/*.py",)), LOG)
    paths = result.documents["path"].to_pylist()
    assert "json/__init__.py" in paths
    assert all(p.startswith("json/") for p in paths)
    assert set(result.skipped) == set(SKIP_REASONS)


def test_records_keep_their_columns_and_bad_ones_are_counted(tmp_path):
    turns = [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4", "weight": 1}]
    swapped = [{"role": "assistant", "content": "2 + 2?"}, {"role": "user", "content": "4"}]
    lines = [json.dumps({"messages": turns, "id": 7}), json.dumps({"messages": swapped}), json.dumps({"messages": "text"}),
             json.dumps({"messages": [{"role": "user"}]}), json.dumps({"other": 1}), "{not json", json.dumps({"messages": []})]
    write(tmp_path / "src", {"chats.jsonl": "\n".join(lines).encode(), "broken.parquet": b"PAR1 not really"})
    result = ingest("chat", config(tmp_path / "src", include=("*.jsonl",), format="jsonl", columns=("messages",)), LOG)
    rows = sorted(result.documents.to_pylist(), key=lambda r: r["path"])
    assert [r["path"] for r in rows] == ["chats.jsonl:1", "chats.jsonl:2"]
    assert json.loads(rows[0]["messages"]) == [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}]
    assert rows[0]["text"] == rows[1]["text"] == "2 + 2?\n4" and json.loads(rows[0]["metadata"]) == {"id": 7}
    assert rows[0]["sha256"] != rows[1]["sha256"]  # the same text with other roles is another document
    assert {k: v for k, v in result.skipped.items() if v} == {"wrong_type": 3, "missing_column": 1, "bad_json": 1}

    broken = ingest("chat", config(tmp_path / "src", include=("*.parquet",), format="parquet", columns=("messages",)), LOG)
    assert broken.skipped["bad_parquet"] == 1 and broken.documents.num_rows == 0
    assert broken.documents.column_names[-1] == "messages"


def test_columns_are_for_records_only(tmp_path):
    with pytest.raises(ValueError, match="give format 'jsonl', 'parquet' or 'arrow'"):
        config(tmp_path, columns=("messages",))
    with pytest.raises(ValueError, match="other than the document's own"):
        config(tmp_path, format="jsonl", columns=("text",))


def test_a_hugging_face_dataset_saved_to_disk_is_read_as_load_from_disk_reads_it(tmp_path):
    """`datasets` itself writes the dataset (a split of two shards, with a `.map()` cache file beside them) and reads it
    back: the documents are its rows, their other columns the metadata; the cache file is not read."""
    datasets = pytest.importorskip("datasets")
    turns = [[{"role": "user", "content": f"{n} + {n}?"}, {"role": "assistant", "content": str(2 * n)}] for n in range(5)]
    rows = {"text": [f"def f{n}():\n    return {n}\n" for n in range(5)], "lang": ["py"] * 5, "stars": list(range(5)), "messages": turns}
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows), "test": datasets.Dataset.from_dict({k: v[:1] for k, v in rows.items()})})
    splits.save_to_disk(str(tmp_path / "hf"), num_shards={"train": 2, "test": 1})
    datasets.load_from_disk(str(tmp_path / "hf" / "train")).map(lambda row: {"text": "cached, not saved"})
    assert any(path.name.startswith("cache-") for path in (tmp_path / "hf" / "train").iterdir())
    source = SourceConfig(kind="directory", path=str(tmp_path / "hf" / "train"), format="arrow")
    assert source.include == ("**/data-*.arrow",) and SourceConfig(**source.model_dump()) == source  # written out in its dump

    result = ingest("hub", source, LOG)
    theirs = datasets.load_from_disk(str(tmp_path / "hf" / "train"))
    ours = sorted(result.documents.to_pylist(), key=lambda row: row["path"])
    assert [row["text"] for row in ours] == theirs["text"]
    assert [row["path"] for row in ours] == ["data-00000-of-00002.arrow:0", "data-00000-of-00002.arrow:1", "data-00000-of-00002.arrow:2",
                                            "data-00001-of-00002.arrow:0", "data-00001-of-00002.arrow:1"]
    assert json.loads(ours[3]["metadata"]) == {"lang": "py", "stars": 3, "messages": turns[3]}
    assert result.files_read == 2 and not any(result.skipped.values())

    chats = ingest("hub", SourceConfig(kind="directory", path=str(tmp_path / "hf"), format="arrow", columns=("messages",)), LOG)
    assert chats.documents.num_rows == 6 and chats.documents.column_names[-1] == "messages"  # both splits, from the top
    assert sorted(chats.documents["messages"].to_pylist()) == sorted(json.dumps(t) for t in [*turns, turns[0]])


def test_arrow_files_with_a_footer_are_read_and_broken_ones_counted(tmp_path):
    import pyarrow as pa

    write(tmp_path / "src", {"broken.arrow": b"ARROW1 not really", "empty.arrow": b""})
    with pa.ipc.new_file(tmp_path / "src" / "table.arrow", pa.schema([("text", pa.string())])) as writer:
        writer.write_table(pa.table({"text": ["one", "two"]}))
    result = ingest("files", config(tmp_path / "src", include=("*.arrow",), format="arrow"), LOG)
    assert sorted(result.documents["text"].to_pylist()) == ["one", "two"]
    assert {reason: count for reason, count in result.skipped.items() if count} == {"bad_arrow": 1, "empty": 1}


def test_an_iceberg_source_reads_a_snapshot_of_a_table_as_its_scan_gives_it(tmp_path, monkeypatch):
    import pyarrow as pa
    from pyiceberg.catalog import load_catalog

    from factory.config.sources import source_files

    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__URI", f"sqlite:///{tmp_path / 'catalog.db'}")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__WAREHOUSE", f"file://{tmp_path / 'warehouse'}")
    monkeypatch.setenv("FACTORY_CACHE", str(tmp_path / "cache"))
    catalog = load_catalog("lake", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path / 'warehouse'}")
    catalog.create_namespace("corpora")
    schema = pa.schema([("text", pa.large_string()), ("url", pa.string())])
    table = catalog.create_table("corpora.web", schema=schema)
    texts, urls = [f"page {n}\n" * 100 * (n + 1) for n in range(5)], [f"https://x/{n}" for n in range(5)]  # 0.7 to 3.5 kB
    table.append(pa.table({"text": texts[:3], "url": urls[:3]}, schema=schema))
    first = table.current_snapshot().snapshot_id
    table.append(pa.table({"text": texts[3:], "url": urls[3:]}, schema=schema))
    table.delete("url == 'https://x/0'")

    pinned = SourceConfig.model_validate({"kind": "iceberg", "catalog": "lake", "table": "corpora.web", "snapshot": first})
    assert pinned.format == "parquet" and pinned.include == ("*.parquet",)
    rows = ingest("web", pinned, LOG).documents.to_pylist()
    assert sorted(row["text"] for row in rows) == texts[:3] and sorted(json.loads(row["metadata"])["url"] for row in rows) == urls[:3]

    current = SourceConfig.model_validate({"kind": "iceberg", "catalog": "lake", "table": "corpora.web", "max_file_bytes": 12_000})
    theirs = catalog.load_table("corpora.web").scan().to_arrow()  # pyiceberg reads the table itself
    listing = source_files(current)
    assert len(listing.files) > 1 and not any(value.startswith("too_large") for value in listing.files.values())  # parts within the bound
    assert sorted(ingest("web", current, LOG).documents["text"].to_pylist()) == sorted(theirs["text"].to_pylist())  # deletes applied
    assert listing.digest != source_files(pinned).digest and source_files(current) == listing

    for fields, said in (({"table": "corpora.nope"}, "source.table: catalog 'lake' has no table 'corpora.nope'"),
                         ({"table": "corpora.web", "snapshot": 12345}, "source.snapshot: table 'corpora.web' has no snapshot 12345"),
                         ({"catalog": "nowhere", "table": "corpora.web"}, "source.catalog: pyiceberg cannot open the catalog 'nowhere'")):
        with pytest.raises(ConfigError, match=re.escape(said)):
            source_files(SourceConfig.model_validate({"kind": "iceberg", "catalog": "lake", **fields}))


def test_a_source_spilled_in_many_small_batches_gives_the_rows_one_batch_gives_by_id_a_batch_at_a_time(tmp_path, monkeypatch):
    """Ingest holds no source whole: the documents spill to a file a batch at a time (by rows, or by bytes of text) and
    each pass reads back one batch of the id order at a time; the rows are those of a spill in one batch, in id order,
    however they were cut, for files that are documents and for files of records."""
    from factory.data import ingest as module

    write(tmp_path / "src", {f"d{n:02d}/m{n}.py": f"value_{n} = {n}\n".encode() * (n + 1) for n in range(23)})
    write(tmp_path / "src", {f"r{n}.jsonl": "".join(json.dumps({"text": f"record {n}.{i}"}) + "\n" for i in range(5)).encode()
                             for n in range(4)})
    sources = [config(tmp_path / "src", include=("**/*.py",), exclude=()), config(tmp_path / "src", include=("*.jsonl",), format="jsonl")]
    whole = [ingest("code", source).documents for source in sources]
    monkeypatch.setattr(module, "BATCH_ROWS", 3)
    monkeypatch.setattr(module, "SPILL_BATCH_BYTES", 40)
    for source, expected in zip(sources, whole, strict=True):
        with read_documents("code", source, LOG) as result:
            passes = [list(result.documents.batches()) for _ in range(2)]  # a commit that lost writes the rows again
        assert all(batch.num_rows <= 3 for batch in passes[0]) and len(passes[0]) >= expected.num_rows / 3
        for batches in passes:
            assert pa.Table.from_batches(batches).equals(expected)
    assert whole[0].num_rows == 23 and whole[1].num_rows == 20
