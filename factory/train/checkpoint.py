"""Checkpoints on disk: atomic saves, a checksum per checkpoint, retention by policy, resume from the latest good one.

A checkpoint is `step_<n>.pt` (one file, written by rank 0) or, sharded, the directory `step_<n>/`
that `torch.distributed.checkpoint` writes with every rank writing its share; either way
`step_<n>.json` (step, format, sha256, size, metrics) is written last, so a checkpoint without one
was cut short and does not exist; one whose bytes no longer match the checksum is skipped with a
warning in favour of an older one. The sha256 of a directory is that of its listing of file names
and file digests. Saves can run on a background thread: the state is copied first, so training
goes on while the disk works. Rank 0 tells a sink of each checkpoint once its record is written,
and of each one retention deletes: the stage reports them to the orchestrator as they happen.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import shutil
import sys
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

from factory.atomic import fsync_directory, write_atomic
from factory.errors import ArtifactError
from factory.train.distributed import SINGLE, World, gather
from factory.train.records import DELETED, FILE, SAVED, SHARDED, CheckpointEvent, SavedCheckpoint, published

CheckpointSink = Callable[[CheckpointEvent], None]
"""Hears of a checkpoint saved or deleted (see `CheckpointDir`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RetentionPolicy:
    """Which checkpoints stay: the last `keep_last`, plus the best by `best_metric` (lowest), plus the final one, plus the
    one of step 0 (the starting weights) when there is one."""

    keep_last: int = 2
    best_metric: str | None = "loss"


def checkpoint_digest(path: Path, world: World = SINGLE) -> tuple[str, int]:
    """The sha256 and size in bytes of a checkpoint: of its bytes, or of a sharded checkpoint's listing of file digests.

    Every rank of `world` calls it for a sharded checkpoint: each hashes its share of the files and they swap digests.
    """
    if not path.is_dir():
        data = path.read_bytes()
        return hashlib.sha256(data).hexdigest(), len(data)
    sizes = {p.relative_to(path).as_posix(): p.stat().st_size for p in path.rglob("*") if p.is_file()}
    mine = {name: hashlib.sha256((path / name).read_bytes()).hexdigest() for name in _share(sizes, world)}
    digests = {name: digest for part in gather(world, mine) for name, digest in part.items()}
    listing = "".join(f"{name}\0{digests[name]}\n" for name in sorted(sizes))
    return hashlib.sha256(listing.encode()).hexdigest(), sum(sizes.values())


def _share(sizes: Mapping[str, int], world: World) -> list[str]:
    """The files this rank hashes: largest first, each to the rank with the fewest bytes so far (the same on every rank)."""
    loads = [0] * world.size
    mine = []
    for name in sorted(sizes, key=lambda name: (-sizes[name], name)):
        rank = loads.index(min(loads))
        loads[rank] += sizes[name]
        if rank == world.rank:
            mine.append(name)
    return mine


def load_checkpoint(path: Path, sha256: str | None = None) -> dict[str, Any]:
    """The state a checkpoint holds, loaded on the CPU; with `sha256`, only from bytes that match it (else ArtifactError)."""
    if not path.is_dir():
        data = path.read_bytes()
        if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
            raise ArtifactError(f"checkpoint {path} does not match its recorded sha256")
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    if sha256 is not None and checkpoint_digest(path)[0] != sha256:
        raise ArtifactError(f"checkpoint {path} does not match its recorded sha256")
    from torch.distributed.checkpoint import FileSystemReader  # only sharded checkpoints need it (DCP: 1.6 s to import)
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    # Every rank reads the whole state (data parallel ranks all hold it), so no collective is involved.
    _load_state_dict(state, storage_reader=FileSystemReader(path), planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    if isinstance(state.get("optimizer"), dict) and "state" in state["optimizer"]:  # the sharded format keys it by str
        state["optimizer"]["state"] = {int(key): value for key, value in state["optimizer"]["state"].items()}
    return state


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

    def __init__(
        self, directory: Path, policy: RetentionPolicy, log: logging.Logger, asynchronous: bool = False, sharded: bool = False,
        world: World = SINGLE, on_event: CheckpointSink | None = None,
    ) -> None:
        """Sharded: every rank of `world` calls `save` (rank 0 alone otherwise); they write their shares of one directory.

        `on_event` hears, on rank 0, of every checkpoint saved (after its record) and deleted by retention; it may be called
        from the background thread of an asynchronous save.
        """
        self.directory = directory
        self.on_event = on_event if world.is_main else None
        self.policy = policy
        self.log = log
        self.asynchronous = asynchronous
        self.sharded = sharded
        self.world = world
        # A background save talks to the other ranks while the step loop does: it needs a group of its own.
        self._group = dist.new_group(backend="gloo") if sharded and asynchronous and world.size > 1 else None
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
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.sharded:
            path = self._write_shards(step, state)
            if path is None:
                return
            sha256, size = checkpoint_digest(path)
        else:
            buffer = io.BytesIO()
            torch.save(canonical(dict(state)), buffer)
            data = buffer.getvalue()
            path = self.directory / f"step_{step:06d}.pt"
            write_atomic(path, data)
            sha256, size = hashlib.sha256(data).hexdigest(), len(data)
        self.bytes_written += size
        record = {"step": step, "format": SHARDED if self.sharded else FILE, "sha256": sha256, "size": size, "metrics": metrics}
        write_atomic(path.with_suffix(".json"), json.dumps(record, sort_keys=True).encode())
        self._tell(SAVED, SavedCheckpoint(step=step, path=path, sha256=sha256, size=size, metrics=metrics))
        self._retain(step)

    def _tell(self, event: Literal["saved", "deleted"], checkpoint: SavedCheckpoint) -> None:
        if self.on_event is not None:
            self.on_event(CheckpointEvent(event=event, checkpoint=checkpoint))

    def _write_shards(self, step: int, state: Mapping[str, Any]) -> Path | None:
        """Every rank writes its share into a temp directory; rank 0 renames it into place once all are on disk and returns it."""
        from torch.distributed.checkpoint import FileSystemWriter  # as in load_checkpoint: only here
        from torch.distributed.checkpoint import save as dcp_save

        path = self.directory / f"step_{step:06d}"
        tmp = path.with_name(path.name + ".tmp")
        with warnings.catch_warnings():  # one process without a process group is a world of one, as meant
            warnings.filterwarnings("ignore", message=".*assuming the intent is to save in a single process.*")
            # Returns on rank 0 after every rank reported its files written and fsynced, and the metadata is written.
            dcp_save(dict(state), storage_writer=FileSystemWriter(tmp, sync_files=True), process_group=self._group,
                     no_dist=self.world.size == 1)
        if not self.world.is_main:
            return None
        if path.exists():  # a save of this step that lost its record: not a checkpoint
            shutil.rmtree(path)
        tmp.rename(path)
        fsync_directory(path.parent)
        return path

    def complete(self) -> list[SavedCheckpoint]:
        """Every checkpoint whose JSON record exists, by step (checksums not verified here)."""
        return published(self.directory)

    def latest(self) -> tuple[SavedCheckpoint, dict[str, Any]] | None:
        """The newest checkpoint whose bytes match its checksum, loaded; damaged ones are skipped with a warning."""
        for checkpoint in reversed(self.complete()):
            try:
                return checkpoint, load_checkpoint(checkpoint.path, checkpoint.sha256)
            except ArtifactError:
                self.log.warning("checkpoint %s does not match its checksum; skipping it for an older one", checkpoint.name)
            except (OSError, RuntimeError, ValueError) as e:
                self.log.warning("checkpoint %s is unreadable (%s); trying an older one", checkpoint.name, e)
        return None

    def _retain(self, newest: int) -> None:
        checkpoints = self.complete()
        keep = {c.step for c in checkpoints[-self.policy.keep_last :]} if self.policy.keep_last else set()
        keep.add(newest)
        keep.add(0)  # the weights a stage started from, saved only when asked (`checkpoint_at_start`): what its curve starts at
        metric = self.policy.best_metric
        scored = [c for c in checkpoints if metric and metric in c.metrics]
        if scored:
            keep.add(min(scored, key=lambda c: (c.metrics[metric], c.step)).step)
        for checkpoint in checkpoints:
            if checkpoint.step not in keep:
                checkpoint.path.with_suffix(".json").unlink(missing_ok=True)  # the record first: never a record without bytes
                _remove(checkpoint.path)
                self._tell(DELETED, checkpoint)
                self.log.info("deleted checkpoint %s by policy (keep last %d, best by %s)", checkpoint.name, self.policy.keep_last, metric)

    def drop_incomplete(self) -> None:
        """Remove files a killed save left behind (temp files, bytes without a record)."""
        recorded = {c.path.name for c in self.complete()}
        for path in self.directory.iterdir() if self.directory.is_dir() else []:
            if path.suffix == ".tmp" or (path.suffix != ".json" and path.name not in recorded):
                self.log.info("removing %s, left by an interrupted save", path.name)
                _remove(path)


def _remove(path: Path) -> None:
    """A checkpoint file or a sharded checkpoint's directory, gone."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
