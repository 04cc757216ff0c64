"""Dataset checks on real table versions: empty, schema, duplicate share."""

import pyarrow as pa

from factory.data.checks import check_version
from factory.data.documents import empty_documents
from factory.data.tables import write_version
from tests.data.conftest import LOG, documents


def outcomes(catalog, table, tag, bound=0.0):
    return {o.name: o for o in check_version(catalog, table, tag, bound)}


def test_a_good_version_passes_every_check(catalog):
    write_version(catalog, "filtered.good", documents("good", {"a.py": "a = 1\n", "b.py": "b = 2\n"}), LOG)
    found = outcomes(catalog, "filtered.good", "v1")
    assert all(o.passed for o in found.values()), found
    assert found["non_empty"].metadata["rows"] == 2


def test_an_empty_version_fails_non_empty_with_what_to_do(catalog):
    write_version(catalog, "filtered.empty", empty_documents(), LOG)
    found = outcomes(catalog, "filtered.empty", "v1")
    assert not found["non_empty"].passed and "loosen the filters" in found["non_empty"].description
    assert found["schema"].passed


def test_duplicates_above_the_bound_fail(catalog):
    twins = documents("dup", {"a.py": "same\n", "b.py": "same\n", "c.py": "other\n", "d.py": "more\n"})
    write_version(catalog, "filtered.dup", twins, LOG)
    assert not outcomes(catalog, "filtered.dup", "v1")["duplicate_share"].passed
    relaxed = outcomes(catalog, "filtered.dup", "v1", bound=0.25)["duplicate_share"]
    assert relaxed.passed and relaxed.metadata["share"] == 0.25


def test_a_table_with_another_schema_fails_the_schema_check(catalog):
    catalog.create_namespace_if_not_exists("curated")
    table = catalog.create_table("curated.odd", schema=pa.schema([pa.field("text", pa.string())]))
    table.append(pa.table({"text": ["x"]}))
    snapshot = table.current_snapshot().snapshot_id
    table.manage_snapshots().create_tag(snapshot, "v1").commit()
    found = check_version(catalog, "curated.odd", "v1", 0.0)
    assert not {o.name: o for o in found}["schema"].passed


def test_the_schema_check_expects_the_columns_the_source_keeps(catalog):
    chats = documents("chat", {"a.jsonl:1": "hi\nhello"}).append_column(
        pa.field("messages", pa.large_string(), nullable=False), pa.array(['[{"role": "user", "content": "hi"}]'], pa.large_string()))
    write_version(catalog, "filtered.chat", chats, LOG)
    kept = outcomes_keeping(catalog, "filtered.chat", ("messages",))
    assert kept["schema"].passed and "kept columns messages" in kept["schema"].description
    assert not outcomes(catalog, "filtered.chat", "v1")["schema"].passed  # a column no source keeps is not the schema

    write_version(catalog, "filtered.plain", documents("plain", {"a.jsonl:1": "hi"}), LOG)
    missing = outcomes_keeping(catalog, "filtered.plain", ("messages",))["schema"]
    assert not missing.passed
    assert missing.description.startswith("filtered.plain@v1 has no column 'messages', which its source keeps (source.columns); "
                                           "its columns: id, source, path, text, bytes, sha256, metadata")
    assert outcomes_keeping(catalog, "filtered.plain", ("messages",))["non_empty"].passed


def outcomes_keeping(catalog, table, columns):
    return {o.name: o for o in check_version(catalog, table, "v1", 0.0, columns)}
