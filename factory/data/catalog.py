"""The Iceberg catalog: pyiceberg's SqlCatalog (sqlite by default, PostgreSQL for teams) with a warehouse of table files
on local disk, or in an object store.

`$FACTORY_DATABASE_URL` (`postgresql://user:password@host:5432/db`) is the deploy profile: the
catalog's tables live in that database (Dagster's storage too, see `factory.cli.common.dagster_home`),
so several machines and concurrent runs commit to one catalog. `$FACTORY_STORE=s3://bucket/prefix`
puts the warehouse at `s3://bucket/prefix/warehouse`, read and written with pyiceberg's file IO for
the store's scheme, configured by the store's backend (`factory.storage.table_properties`: for S3 the
endpoint, region and credentials of the standard AWS variables, read when the catalog opens and never
written into a stage request); the catalog database stays where it is. pyiceberg is
imported when a catalog is opened: naming one (a stage request, `factory plan`) stays light.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyiceberg.catalog.sql import SqlCatalog

CATALOG_NAME = "factory"
OPENED_MODULES = ("pyiceberg.catalog.sql", "sqlalchemy.dialects.sqlite", "pyiceberg.io.pyarrow")
"""What opening a catalog (pyiceberg's SQL catalog; SQLAlchemy and its dialect for the embedded sqlite) and reading or
writing its tables (pyiceberg's pyarrow IO) import, here lazily: a warm interpreter imports them ahead for the stages it
forks."""
DATABASE_ENV = "FACTORY_DATABASE_URL"
STORE_ENV = "FACTORY_STORE"
INIT_ATTEMPTS = 5
SQLITE_WAIT_S = 60
"""How long a write to the embedded sqlite catalog waits for another writer's commit."""


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

    @classmethod
    def at(cls, root: str | Path) -> CatalogConfig:
        """The catalog of the stores under `root`: in `$FACTORY_DATABASE_URL` when set, else the embedded sqlite one."""
        from factory.storage import in_object_store

        url, store = os.environ.get(DATABASE_ENV), os.environ.get(STORE_ENV, "")
        local = cls.local(Path(root) / "iceberg")
        warehouse = f"{store.rstrip('/')}/warehouse" if in_object_store(store) else local.warehouse  # (the registry refuses any other)
        return cls(uri=sqlalchemy_url(url) if url else local.uri, warehouse=warehouse)

    def to_json(self) -> dict[str, str]:
        """Plain JSON form."""
        return {"uri": self.uri, "warehouse": self.warehouse}


def sqlalchemy_url(url: str) -> str:
    """A PostgreSQL URL with the psycopg2 driver, which dagster-postgres needs too; anything else as given."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg2://" + url.removeprefix(prefix)
    return url


def open_catalog(config: CatalogConfig) -> SqlCatalog:
    """Open (creating if needed) the catalog described by `config`."""
    from pyiceberg.catalog.sql import SqlCatalog
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    from factory.storage import table_properties

    if config.warehouse.startswith("file://"):
        Path(config.warehouse.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
    if config.uri.startswith("sqlite:///"):
        Path(config.uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    # The embedded sqlite catalog: a writer waits up to SQLITE_WAIT_S for another's commit (sqlite3's default, 5 s, ran out
    # for four processes saving prompts at once on a loaded machine: "database is locked").
    uri = f"{config.uri}?timeout={SQLITE_WAIT_S}" if config.uri.startswith("sqlite:///") and "?" not in config.uri else config.uri
    for attempt in range(INIT_ATTEMPTS):
        try:
            return SqlCatalog(CATALOG_NAME, uri=uri, warehouse=config.warehouse, **table_properties(config.warehouse))
        except (IntegrityError, ProgrammingError):
            # Another process created the catalog's own tables at the same moment (PostgreSQL reports the
            # duplicate instead of skipping it): they exist now, so opening again finds them.
            if attempt == INIT_ATTEMPTS - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")
