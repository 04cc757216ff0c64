"""Checkpoints on disk: atomic saves, a checksum per file, retention by policy, resume from the latest good one.

A checkpoint is `step_<n>.pt` plus `step_<n>.json` (step, sha256, size, metrics). The JSON is
written last, so a checkpoint without one was cut short and does not exist; one whose bytes no
longer match the checksum is skipped with a warning in favour of an older one. Saves can run on
a background thread: the state is copied first, so training goes on while the disk works.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from factory.errors import ArtifactError

NAME = re.compile(r"^step_(\d{6,})\.json$")


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
class RetentionPolicy:
    """Which checkpoints stay: the last `keep_last`, plus the best by `best_metric` (lowest), plus the final one."""

    keep_last: int = 2
    best_metric: str | None = "loss"


def partition_key(experiment: str, stage: str, step: int) -> str:
    """The `checkpoints` partition of one checkpoint: `<experiment>__<stage>-<step:06d>`."""
    return f"{experiment}__{stage}-{step:06d}"


def published(directory: Path) -> list[SavedCheckpoint]:
    """The complete checkpoints in a directory (a published training artifact, or a run's checkpoint directory), by step."""
    return CheckpointDir(directory, RetentionPolicy(), logging.getLogger(__name__)).complete()


def canonical(value: Any) -> Any:
    """The state tree with every string interned.

    Pickle writes a string once and refers back to it when the same object recurs; strings read
    back from a checkpoint are fresh objects, so without this a resumed run would write other
    bytes for the same state.
    """
    if isinstance(value, str):
        return sys.intern(value)
    if isinstance(value, Mapping):
        return {canonical(key): canonical(child) for key, child in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(canonical(child) for child in value)
    return value


def clone_state(value: Any) -> Any:
    """A deep copy of a state tree whose tensors no longer share memory with training."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, Mapping):
        return {key: clone_state(child) for key, child in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(clone_state(child) for child in value)
    return value


class CheckpointDir:
    """The checkpoints of one training run in one directory."""

    def __init__(self, directory: Path, policy: RetentionPolicy, log: logging.Logger, asynchronous: bool = False) -> None:
        self.directory = directory
        self.policy = policy
        self.log = log
        self.asynchronous = asynchronous
        self._writer: threading.Thread | None = None
        self._error: BaseException | None = None
        self.bytes_written = 0
        """Bytes of checkpoints written through this object (deleted ones included)."""

    def save(self, step: int, state: Mapping[str, Any], metrics: Mapping[str, float], final: bool = False) -> None:
        """Save `state` as the checkpoint of `step` (in the background when asynchronous), then apply retention."""
        self.wait()
        snapshot = clone_state(state) if self.asynchronous else state
        if self.asynchronous and not final:
            self._writer = threading.Thread(target=self._write_guarded, args=(step, snapshot, dict(metrics)), daemon=True)
            self._writer.start()
        else:
            self._write(step, snapshot, dict(metrics))

    def wait(self) -> None:
        """Block until a background save is on disk; re-raise its error."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        if self._error is not None:
            error, self._error = self._error, None
            raise ArtifactError(f"saving a checkpoint in {self.directory} failed: {error}") from error

    def _write_guarded(self, step: int, state: Mapping[str, Any], metrics: dict[str, float]) -> None:
        try:
            self._write(step, state, metrics)
        except BaseException as e:  # handed to the training thread by wait()
            self._error = e

    def _write(self, step: int, state: Mapping[str, Any], metrics: dict[str, float]) -> None:
        buffer = io.BytesIO()
        torch.save(canonical(dict(state)), buffer)
        data = buffer.getvalue()
        path = self.directory / f"step_{step:06d}.pt"
        self.directory.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, data)
        self.bytes_written += len(data)
        record = {"step": step, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "metrics": metrics}
        _atomic_write(path.with_suffix(".json"), json.dumps(record, sort_keys=True).encode())
        self._retain(step)

    def complete(self) -> list[SavedCheckpoint]:
        """Every checkpoint whose JSON record exists, by step (checksums not verified here)."""
        found = []
        for record_path in sorted(self.directory.glob("step_*.json")):
            if not NAME.match(record_path.name):
                continue
            try:
                record = json.loads(record_path.read_text())
            except (OSError, ValueError):
                continue
            found.append(SavedCheckpoint(
                step=record["step"], path=record_path.with_suffix(".pt"), sha256=record["sha256"], size=record["size"],
                metrics=record.get("metrics", {}),
            ))
        return sorted(found, key=lambda c: c.step)

    def latest(self) -> tuple[SavedCheckpoint, dict[str, Any]] | None:
        """The newest checkpoint whose bytes match its checksum, loaded; damaged ones are skipped with a warning."""
        for checkpoint in reversed(self.complete()):
            try:
                data = checkpoint.path.read_bytes()
            except OSError as e:
                self.log.warning("checkpoint %s is unreadable (%s); trying an older one", checkpoint.name, e)
                continue
            if hashlib.sha256(data).hexdigest() != checkpoint.sha256:
                self.log.warning("checkpoint %s does not match its checksum; skipping it for an older one", checkpoint.name)
                continue
            return checkpoint, torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        return None

    def _retain(self, newest: int) -> None:
        checkpoints = self.complete()
        keep = {c.step for c in checkpoints[-self.policy.keep_last :]} if self.policy.keep_last else set()
        keep.add(newest)
        metric = self.policy.best_metric
        scored = [c for c in checkpoints if metric and metric in c.metrics]
        if scored:
            keep.add(min(scored, key=lambda c: (c.metrics[metric], c.step)).step)
        for checkpoint in checkpoints:
            if checkpoint.step not in keep:
                checkpoint.path.with_suffix(".json").unlink(missing_ok=True)  # the record first: never a record without bytes
                checkpoint.path.unlink(missing_ok=True)
                self.log.info("deleted checkpoint %s by policy (keep last %d, best by %s)", checkpoint.name, self.policy.keep_last, metric)

    def drop_incomplete(self) -> None:
        """Remove files a killed save left behind (temp files, bytes without a record)."""
        recorded = {c.path.name for c in self.complete()}
        for path in self.directory.iterdir() if self.directory.is_dir() else []:
            if path.suffix == ".tmp" or (path.suffix == ".pt" and path.name not in recorded):
                self.log.info("removing %s, left by an interrupted save", path.name)
                path.unlink(missing_ok=True)


def _atomic_write(path: Path, data: bytes) -> None:
    """Temp file, fsync, rename, fsync of the directory: the file is whole or absent."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
