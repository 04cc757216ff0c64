"""What a training run leaves on disk, read without torch: the checkpoint records and the logs beside them.

A checkpoint `step_<n>.pt` (or the directory `step_<n>/`, sharded) exists once its record
`step_<n>.json` (step, format, sha256, size, metrics) is written, last. The stage tells the
orchestrator of each one saved or deleted in a message (`checkpoint_message`), which it turns into
`checkpoints` partitions without reading the stage's disk; the run report plots the logs; neither
loads weights.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from factory.errors import ArtifactError

if TYPE_CHECKING:
    from factory.registry import Manifest, Registry

CHECKPOINT_DIR = "checkpoints"
NAME = re.compile(r"^step_(\d{6,})\.json$")
FILE, SHARDED = "file", "sharded"
SAVED, DELETED = "saved", "deleted"
MESSAGE_KIND = "checkpoint"
"""The `kind` of a checkpoint message, among the stage's other messages (metrics)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SavedCheckpoint:
    """One complete checkpoint on disk."""

    step: int
    path: Path
    sha256: str
    size: int
    metrics: dict[str, float]

    @property
    def name(self) -> str:
        return self.path.name


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointEvent:
    """A checkpoint just saved (complete, its record written) or just deleted by retention, as the stage reports it."""

    event: Literal["saved", "deleted"]
    checkpoint: SavedCheckpoint


def checkpoint_message(event: CheckpointEvent) -> dict[str, Any]:
    """The JSON message a stage sends about one checkpoint: what it is and where it is now."""
    saved = event.checkpoint
    return {"kind": MESSAGE_KIND, "event": event.event, "step": saved.step, "path": str(saved.path), "sha256": saved.sha256,
            "size": saved.size, "metrics": dict(saved.metrics)}


def read_checkpoint_message(message: Any) -> CheckpointEvent | None:
    """The checkpoint event a message carries; None for a message of another kind."""
    if not isinstance(message, dict) or message.get("kind") != MESSAGE_KIND or message.get("event") not in (SAVED, DELETED):
        return None
    checkpoint = SavedCheckpoint(step=int(message["step"]), path=Path(message["path"]), sha256=message["sha256"],
                                 size=int(message["size"]), metrics=dict(message.get("metrics", {})))
    return CheckpointEvent(event=message["event"], checkpoint=checkpoint)


def partition_key(experiment: str, stage: str, step: int) -> str:
    """The `checkpoints` partition of one checkpoint: `<experiment>__<stage>-<step:06d>`."""
    return f"{experiment}__{stage}-{step:06d}"


def published(directory: Path) -> list[SavedCheckpoint]:
    """Every checkpoint in a directory (a published training artifact, or a run's checkpoint directory) whose record
    exists and reads as one (`recorded_in`), by step (checksums not verified here)."""
    return recorded_in([path.name for path in directory.glob("step_*.json")], lambda name: (directory / name).read_bytes(), directory)


def kept_in(registry: Registry, manifest: Manifest, base: Path = Path(), unread: list[str] | None = None) -> list[SavedCheckpoint]:
    """The checkpoints kept in a published training artifact, from its records (`recorded_in`), each record read alone
    through `registry` (from an object store no checkpoint is fetched), their paths under `base`. A record the registry
    finds damaged or missing raises its ArtifactError, unless `unread` is given: then its name is added there and it is
    left out (a viewer lists what it can and asks again later). One it cannot read from this machine's disk is left out
    (`recorded_in`); a store that does not answer raises its StorageError either way."""
    def read(name: str) -> bytes | None:
        try:
            return registry.read(manifest, name)
        except (ArtifactError, OSError):
            if unread is None:
                raise
            unread.append(name)
            return None

    return recorded_in(manifest.files, read, base)


def recorded_in(names: Iterable[str], read: Callable[[str], bytes | None], base: Path) -> list[SavedCheckpoint]:
    """Every checkpoint whose record is among the file `names` of one directory (each record's bytes from `read`, which
    may read it from an object store), its path under `base`, by step. A record that cannot be read, is not JSON, is not
    an object or lacks one of the trainer's keys (step, sha256, size) names no checkpoint: it is left out."""
    found = []
    for name in sorted(names):
        if not NAME.match(name):
            continue
        stem = name.removesuffix(".json")
        try:
            record = json.loads(read(name) or b"")
            path = base / (stem if record.get("format") == SHARDED else f"{stem}.pt")
            found.append(SavedCheckpoint(step=record["step"], path=path, sha256=record["sha256"], size=record["size"],
                                         metrics=record.get("metrics", {})))
        except (OSError, ValueError, KeyError, AttributeError):  # not a record the trainer wrote: no checkpoint
            continue
    return sorted(found, key=lambda c: c.step)
