"""Quality checks on a dataset version; a failed check blocks training on it.

The table code is imported when a check runs: the orchestrator declares the checks (their names)
without loading pyiceberg.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

CHECKS = ("non_empty", "schema", "duplicate_share")


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckOutcome:
    """The verdict of one check on one version."""

    name: str
    passed: bool
    description: str
    metadata: dict[str, Any] = field(default_factory=dict)


def check_version(catalog: Catalog, table_name: str, tag: str, max_duplicate_share: float, columns: tuple[str, ...] = ()) -> list[CheckOutcome]:
    """Run every check of `CHECKS` on `table_name@tag`, a document table that keeps the record `columns` of its source."""
    import pyarrow.compute as pc

    from factory.data.documents import document_schemas
    from factory.data.tables import read_version, resolve, version_schema

    snapshot_id = resolve(catalog, table_name, tag)
    expected = [(f.name, str(f.field_type), f.required) for f in document_schemas(columns)[1].fields]
    found = [(f.name, str(f.field_type), f.required) for f in version_schema(catalog.load_table(table_name), snapshot_id).fields]
    if "sha256" in [name for name, _, _ in found]:
        digests = read_version(catalog, table_name, snapshot_id, ("sha256",))["sha256"]
        rows, distinct = len(digests), pc.count_distinct(digests).as_py()
    else:  # not a document table: count rows, and no duplicate share can be measured
        rows = catalog.load_table(table_name).scan(snapshot_id=snapshot_id).to_arrow().num_rows
        distinct = 0
    duplicates = rows - distinct
    share = duplicates / rows if rows else 0.0
    ref = f"{table_name}@{tag}"
    return [
        CheckOutcome(
            name="non_empty", passed=rows > 0, metadata={"rows": rows},
            description=f"{ref} has {rows} documents" + ("" if rows else "; loosen the filters or widen the source"),
        ),
        CheckOutcome(
            name="schema", passed=found == expected, metadata={"columns": [name for name, _, _ in found]},
            description=f"{ref} has the document schema" + (f" and the kept columns {', '.join(columns)}" if columns else "")
            if found == expected else _schema_difference(ref, found, expected, columns),
        ),
        CheckOutcome(
            name="duplicate_share", passed=share <= max_duplicate_share,
            metadata={"duplicates": duplicates, "share": round(share, 6), "bound": max_duplicate_share},
            description=f"{ref}: {duplicates} exact duplicates ({share:.2%}), bound {max_duplicate_share:.2%}"
            + ("" if share <= max_duplicate_share else "; turn on dedup.exact or raise max_duplicate_share"),
        ),
    ]


def _schema_difference(ref: str, found: list[tuple[str, str, bool]], expected: list[tuple[str, str, bool]], columns: tuple[str, ...]) -> str:
    """What a version's schema lacks or has in place of the document schema with its kept columns."""
    names = [name for name, _, _ in found]
    if missing := [name for name in columns if name not in names]:
        return (f"{ref} has no column {', '.join(map(repr, missing))}, which its source keeps (source.columns); its columns: "
                f"{', '.join(names)}; ingest the dataset again with records that hold them")
    return f"{ref} columns {found} differ from {expected}"
