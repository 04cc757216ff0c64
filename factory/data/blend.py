"""A blend: the immutable training mixture over table versions, with weights and modes.

The blend names each version by its content tag where it has one, so the same data gives the
same blend (and the same fingerprint downstream) even after the catalog is rebuilt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from pyiceberg.catalog import Catalog

from factory.config.fingerprint import sha256_of
from factory.config.data_sections import DataConfig
from factory.data.documents import SPLITS, split_of
from factory.data.tables import REJECTED_PREFIX, TableVersion, parse_ref, resolve, resolve_pin, stream_version
from factory.errors import ArtifactError


@dataclass(frozen=True, kw_only=True, slots=True)
class BlendPart:
    """One table version in the mixture."""

    label: str
    """The dataset name, or the `table@tag` the config pinned."""
    table: str
    tag: str
    """The tag the loader resolves: the content tag when the version has one."""
    version: str
    """The version's human tag (`v<n>` or a name)."""
    weight: float
    mode: str
    """`finite` or `oversample`."""
    rows: int
    split_rows: dict[str, int] = field(default_factory=dict)
    """Documents per split (counted once when the blend is built, so readers need not count them again)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Blend:
    """The mixture training streams from, and how documents are split for validation."""

    parts: tuple[BlendPart, ...]
    validation_percent: int

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form, as stored in the blend artifact."""
        return {"parts": [asdict(part) for part in self.parts], "validation_percent": self.validation_percent}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Blend:
        """Inverse of `to_json`."""
        return cls(parts=tuple(BlendPart(**part) for part in data["parts"]), validation_percent=data["validation_percent"])

    @property
    def fingerprint(self) -> str:
        """Hash of the recipe: the same versions, weights and modes give the same blend."""
        return sha256_of(self.to_json())

    @property
    def weights(self) -> tuple[float, ...]:
        """Weights normalised to sum to one."""
        total = sum(part.weight for part in self.parts)
        return tuple(part.weight / total for part in self.parts)


def build_blend(catalog: Catalog, data: DataConfig, datasets: Mapping[str, TableVersion]) -> Blend:
    """The blend of `data.blend`: datasets of this experiment from `datasets`, pinned tables from the catalog."""
    parts = []
    for component in data.blend:
        if component.dataset is not None:
            if component.dataset not in datasets:
                raise ArtifactError(f"blend: dataset {component.dataset!r} has no filtered version; materialize filtered_datasets first")
            version = datasets[component.dataset]
            if version.tag.startswith(REJECTED_PREFIX):
                raise ArtifactError(f"blend: {version.ref} failed the dataset checks of filtered_datasets; fix the data or its checks first")
            table, tag, name, rows = version.table, version.content_tag, version.tag, version.rows
        else:
            table, name = parse_ref(component.table or "")
            tag, rows = pinned_version(catalog, table, name)
        splits = count_splits(catalog, table, resolve(catalog, table, tag), data.validation_percent)
        parts.append(BlendPart(
            label=component.label, table=table, tag=tag, version=name, weight=component.weight, mode=component.mode, rows=rows, split_rows=splits,
        ))
    return Blend(parts=tuple(parts), validation_percent=data.validation_percent)


def count_splits(catalog: Catalog, table_name: str, snapshot_id: int, validation_percent: int) -> dict[str, int]:
    """Documents of a table version in each split (one pass over the id column)."""
    counts = dict.fromkeys(SPLITS, 0)
    for batch in stream_version(catalog, table_name, snapshot_id, ("id",)):
        for doc in batch.column("id").to_pylist():
            counts[split_of(doc, validation_percent)] += 1
    return counts


def pinned_version(catalog: Catalog, table_name: str, tag: str) -> tuple[str, int]:
    """(stable tag, rows) of a pinned `table@tag`: its content tag when it has one (never a version its checks rejected)."""
    snapshot_id = resolve_pin(catalog, table_name, tag)
    table = catalog.load_table(table_name)
    content = [name for name, ref in table.refs().items() if ref.snapshot_id == snapshot_id and name.startswith("content-")]
    snapshot = table.snapshot_by_id(snapshot_id)
    rows = int(snapshot.summary["total-records"]) if snapshot is not None and snapshot.summary is not None else 0
    return (content[0] if content else tag), rows
