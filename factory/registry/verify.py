"""Every damaged manifest and artifact in a registry, found by reading it all (what `factory registry verify` prints).

A manifest is damaged when it is not JSON or lacks a key or has one of the wrong type; an
artifact when a file it lists is missing, has other bytes than recorded, or is a symlink, or when
it holds anything the manifest does not list. Artifacts no manifest names are not looked at.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from factory.errors import ArtifactError
from factory.registry.files import sha256_file, structural_damage
from factory.registry.objects import ObjectRegistry
from factory.registry.store import ArtifactStore


@dataclass(frozen=True, kw_only=True, slots=True)
class Damage:
    """One thing wrong in the registry."""

    kind: str
    """manifest | object"""
    path: str
    problem: str

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form."""
        return asdict(self)


def verify(store: ArtifactStore | ObjectRegistry) -> list[Damage]:
    """Every damaged manifest, then the damage of every artifact a readable manifest names (each once)."""
    if isinstance(store, ObjectRegistry):
        return _verify_objects(store)
    damaged: list[Damage] = []
    checked: set[str] = set()
    for path in store.manifest_paths():
        try:
            manifest = store.read_manifest(path)
        except ArtifactError as e:
            damaged.append(Damage(kind="manifest", path=str(path), problem=str(e.__cause__ or e)))
            continue
        if manifest.digest in checked:
            continue
        checked.add(manifest.digest)
        base = store.path(manifest.digest)
        damaged.extend(Damage(kind="object", path=str(base), problem=problem) for problem in object_damage(base, manifest.files))
    return damaged


def object_damage(base: Path, files: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What is wrong with the artifact directory `base` against its manifest's files, every byte read."""
    problems, found = structural_damage(base, files)
    for name, entry in sorted(files.items()):
        if name not in found or found[name].st_size != entry["bytes"]:
            continue  # already named by the layout check
        try:
            if sha256_file(base / name) != entry["sha256"]:
                problems.append(f"{name}: sha256 differs from the manifest's")
        except OSError as e:
            problems.append(f"{name}: unreadable ({e.strerror or e})")
    return problems


def _verify_objects(registry: ObjectRegistry) -> list[Damage]:
    """`verify` for a registry in an object store: each manifest read whole, each artifact's objects downloaded and hashed."""
    damaged: list[Damage] = []
    checked: set[str] = set()
    for key in registry.store.list("manifests/"):
        try:
            manifest = registry.read_manifest(key)
        except ArtifactError as e:
            damaged.append(Damage(kind="manifest", path=f"{registry.location}/{key}", problem=str(e.__cause__ or e)))
            continue
        if manifest.digest not in checked:
            checked.add(manifest.digest)
            where = f"{registry.location}/objects/{manifest.digest}"
            damaged.extend(Damage(kind="object", path=where, problem=problem) for problem in registry.damage(manifest))
    return damaged
