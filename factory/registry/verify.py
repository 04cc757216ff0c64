"""Every damaged manifest and artifact in a registry, found by reading it all (what `factory registry verify` prints).

A manifest is damaged when it is not JSON or lacks a key or has one of the wrong type; an
artifact when a file it lists is missing, has other bytes than recorded, or is a symlink, or when
it holds anything the manifest does not list. Artifacts no manifest names are not looked at. Each registry reads its
own kind of storage (`Registry.verify`); this module holds what they report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from factory.errors import ArtifactError
from factory.registry.files import sha256_file, structural_damage

if TYPE_CHECKING:
    from factory.registry.store import Manifest


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


def damage_of(manifests: Iterable[tuple[str, Callable[[], Manifest]]],
              artifact: Callable[[Manifest], tuple[str, list[str]]]) -> list[Damage]:
    """What `Registry.verify` reports of a registry's manifests, each given as where it is and its read (which raises ArtifactError
    when it is damaged): every damaged manifest, then the damage of every artifact a readable one names, each once
    (`artifact`: where the artifact is, and what is wrong with it)."""
    damaged: list[Damage] = []
    checked: set[str] = set()
    for where, read in manifests:
        try:
            manifest = read()
        except ArtifactError as e:
            damaged.append(Damage(kind="manifest", path=where, problem=str(e.__cause__ or e)))
            continue
        if manifest.digest not in checked:
            checked.add(manifest.digest)
            base, problems = artifact(manifest)
            damaged.extend(Damage(kind="object", path=base, problem=problem) for problem in problems)
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
