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


def check_version(catalog: Catalog, table_name: str, tag: str, max_duplicate_share: float) -> list[CheckOutcome]:
    """Run every check of `CHECKS` on `table_name@tag`."""
    import pyarrow.compute as pc

    from factory.data.documents import SCHEMA
    from factory.data.tables import read_version, resolve

    snapshot_id = resolve(catalog, table_name, tag)
    table = catalog.load_table(table_name)
    snapshot = table.snapshot_by_id(snapshot_id)
    schema = table.schemas()[snapshot.schema_id if snapshot and snapshot.schema_id is not None else table.metadata.current_schema_id]
    expected = [(f.name, str(f.field_type), f.required) for f in SCHEMA.fields]
    found = [(f.name, str(f.field_type), f.required) for f in schema.fields]
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
            description=f"{ref} has the document schema" if found == expected else f"{ref} columns {found} differ from {expected}",
        ),
        CheckOutcome(
            name="duplicate_share", passed=share <= max_duplicate_share,
            metadata={"duplicates": duplicates, "share": round(share, 6), "bound": max_duplicate_share},
            description=f"{ref}: {duplicates} exact duplicates ({share:.2%}), bound {max_duplicate_share:.2%}"
            + ("" if share <= max_duplicate_share else "; turn on dedup.exact or raise max_duplicate_share"),
        ),
    ]
