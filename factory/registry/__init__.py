"""Immutable content-addressed artifacts, their manifests and provenance, behind one seam (`Registry`,
`factory.registry.seam`): on local disk (`ArtifactStore`), or in the object store `$FACTORY_STORE` names
(`ObjectRegistry`); `open_registry` picks."""

from __future__ import annotations

import os
from pathlib import Path

from factory.errors import ConfigError
from factory.registry.provenance import git_commit
from factory.registry.seam import Records, Registry
from factory.registry.store import ArtifactStore, Manifest, Provenance

STORE_ENV = "FACTORY_STORE"
"""An object store for the artifacts and the warehouse (`s3://bucket/prefix`); unset: everything under the root."""

__all__ = ["STORE_ENV", "ArtifactStore", "Manifest", "Provenance", "Records", "Registry", "git_commit", "open_registry"]


def open_registry(local: str | Path, *, patient: bool = False) -> Registry:
    """The registry: in `$FACTORY_STORE` (under `<store>/registry`, with `local` for staging, work and copies read)
    when it names an object store, else on local disk at `local`. `patient`: as `open_store`'s (a stage process)."""
    store = os.environ.get(STORE_ENV, "").strip()
    if not store:
        return ArtifactStore(local)
    from factory.storage import in_object_store, open_store

    if not in_object_store(store):
        raise ConfigError(f"{STORE_ENV}={store}: name an object store (s3://bucket/prefix); the local directory is the "
                          "root (--root, or root in factory.toml), where everything lives when FACTORY_STORE is unset")
    from factory.registry.objects import ObjectRegistry

    return ObjectRegistry(open_store(f"{store.rstrip('/')}/registry", patient=patient), local)
