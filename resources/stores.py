"""Where artifacts and datasets live: the registry and the Iceberg catalog under one root."""

from __future__ import annotations

from pathlib import Path

from dagster import ConfigurableResource

from factory.data.catalog import CatalogConfig
from factory.registry import ArtifactStore, open_registry


class FactoryStores(ConfigurableResource):
    """The embedded defaults: a local registry and a sqlite Iceberg catalog under `root`."""

    root: str = ".factory"

    def registry(self) -> ArtifactStore:
        """The artifact registry. In an object store it is opened patiently (`open_registry(patient=True)`): whoever asks
        here (a run's step, a sensor's tick) works for a run or a daemon that found the store, so an endpoint that does
        not answer is an outage, waited out within `FACTORY_STORE_OUTAGE_S`, not a setting to change."""
        return open_registry(Path(self.root) / "registry", patient=True)

    def catalog(self) -> CatalogConfig:
        """The Iceberg catalog's location."""
        return CatalogConfig.at(Path(self.root))
