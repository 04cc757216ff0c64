"""What the orchestrator hands a stage process: the spec, where the stores are, and provenance."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from factory.config.stages import StageSpec
from factory.data.catalog import CatalogConfig
from factory.errors import ConfigError
from factory.registry.store import Provenance


@dataclass(frozen=True, kw_only=True, slots=True)
class StageRequest:
    """Everything a stage process needs; JSON-serialisable so it can cross a process or pod boundary."""

    spec: StageSpec
    registry: str
    catalog: CatalogConfig
    provenance: Provenance
    processes: int = 1
    """Ranks to start per node (placement: never part of the fingerprint)."""
    nodes: int = 1
    """Machines to spread the ranks over (placement too); the local launcher has one."""
    placement: dict[str, Any] = field(default_factory=dict)
    """Stage-specific placement (RL: `learners` and `actors` ranks), never part of the fingerprint."""
    gpus: int | None = None
    """GPUs per node the stage may compute on (placement too; None: this machine's; see `factory.devices`)."""

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form."""
        return {
            "spec": self.spec.to_json(),
            "registry": self.registry,
            "catalog": self.catalog.to_json(),
            "provenance": {
                "experiment": self.provenance.experiment,
                "config_hash": self.provenance.config_hash,
                "git_commit": self.provenance.git_commit,
                "run_id": self.provenance.run_id,
                "base": dict(self.provenance.base),
            },
            "processes": self.processes,
            "nodes": self.nodes,
            "placement": self.placement,
            "gpus": self.gpus,
        }

    def write(self, path: Path) -> Path:
        """Write the request as JSON to `path`."""
        path.write_text(json.dumps(self.to_json(), indent=2, sort_keys=True))
        return path

    @classmethod
    def read(cls, path: Path) -> StageRequest:
        """Read a request written by `write`."""
        try:
            data = json.loads(Path(path).read_text())
            return cls(
                spec=StageSpec.from_json(data["spec"]),
                registry=data["registry"],
                catalog=CatalogConfig(**data["catalog"]),
                provenance=Provenance(**data["provenance"]),
                processes=int(data.get("processes", 1)),
                nodes=int(data.get("nodes", 1)),
                placement=dict(data.get("placement", {})),
                gpus=None if data.get("gpus") is None else int(data["gpus"]),
            )
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"{path}: not a stage request ({e})") from e
