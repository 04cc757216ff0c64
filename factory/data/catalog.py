"""The Iceberg catalog: pyiceberg's SqlCatalog (sqlite by default) with a local warehouse."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyiceberg.catalog.sql import SqlCatalog

CATALOG_NAME = "factory"


@dataclass(frozen=True, kw_only=True, slots=True)
class CatalogConfig:
    """Where the catalog database and the table files live."""

    uri: str
    """SQLAlchemy URL of the catalog database, e.g. sqlite:////abs/path/catalog.db."""
    warehouse: str
    """Root URI of table data files, e.g. file:///abs/path/warehouse."""

    @classmethod
    def local(cls, root: str | Path) -> CatalogConfig:
        """The embedded default: sqlite database and warehouse under `root`."""
        root = Path(root).resolve()
        return cls(uri=f"sqlite:///{root / 'catalog.db'}", warehouse=(root / "warehouse").as_uri())

    def to_json(self) -> dict[str, str]:
        """Plain JSON form."""
        return {"uri": self.uri, "warehouse": self.warehouse}


def open_catalog(config: CatalogConfig) -> SqlCatalog:
    """Open (creating if needed) the catalog described by `config`."""
    if config.warehouse.startswith("file://"):
        Path(config.warehouse.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
    if config.uri.startswith("sqlite:///"):
        Path(config.uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return SqlCatalog(CATALOG_NAME, uri=config.uri, warehouse=config.warehouse)
