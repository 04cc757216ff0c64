"""Where artifacts and datasets live: the registry and the Iceberg catalog under one root."""

from __future__ import annotations

from pathlib import Path

from dagster import ConfigurableResource

from factory.data.catalog import CatalogConfig
from factory.registry import Registry, open_registry


class FactoryStores(ConfigurableResource):
    """The embedded defaults: a local registry and a sqlite Iceberg catalog under `root`."""

    root: str = ".factory"

    def registry(self, patient: bool = True) -> Registry:
        """The artifact registry. In an object store it is opened patiently (`open_registry(patient=True)`): a run's
        step works for a run that found the store, so an endpoint that does not answer is an outage, waited out within
        `FACTORY_STORE_OUTAGE_S`, not a setting to change. A sensor's tick asks impatiently (`patient=False`): Dagster
        gives a tick about as long as the window, and the next tick tries again."""
        return open_registry(Path(self.root) / "registry", patient=patient)

    def catalog(self) -> CatalogConfig:
        """The Iceberg catalog's location."""
        return CatalogConfig.at(Path(self.root))
