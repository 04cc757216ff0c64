"""Immutable content-addressed artifacts, their manifests and provenance."""

from factory.registry.provenance import git_commit
from factory.registry.store import ArtifactStore, Manifest, Provenance

__all__ = ["ArtifactStore", "Manifest", "Provenance", "git_commit"]
