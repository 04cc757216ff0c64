"""Resuming a run: the newest checkpoint whose bytes match its record, loaded into the live model and optimizer.

A file checkpoint (`.pt`) is read whole and sliced into a sharded model (`parallel.restore`). A sharded directory is
read through torch.distributed.checkpoint into the state the live model and optimizer hold (DTensors under FSDP), so
each rank reads only the shards it needs and DCP's planner reshards between world sizes and between FSDP and DDP; the
ranks share its checksum too (each hashes some of the files). The layout on disk is the one `CheckpointDir` writes:
the optimizer's state keyed by parameter index, as `optimizer.state_dict()` keys it.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from factory.errors import ArtifactError, StageFailed
from factory.train.checkpoint import CheckpointDir, checkpoint_digest, load_checkpoint
from factory.train.distributed import World
from factory.train.parallel import check_shape, implementation_here, restore
from factory.train.records import SavedCheckpoint

MODEL, SLOTS = "model.", "optimizer.state."
"""The prefixes of the keys DCP flattens the model's tensors and the optimizer's per-parameter state to."""


def resume(
    checkpoints: CheckpointDir, model: nn.Module, optimizer: torch.optim.Optimizer, world: World, log: logging.Logger,
) -> tuple[SavedCheckpoint, dict[str, Any]] | None:
    """Load the newest good checkpoint into `model` and `optimizer` (every rank calls it) and return it with the rest of its
    state (step, data position, random states, control); None when there is none. Damaged or unreadable checkpoints are
    skipped for older ones with a warning; one of another model shape is refused (ConfigError)."""
    half_loaded = None  # a checkpoint that failed after writing into the model: starting fresh would train on its parts
    for checkpoint in reversed(checkpoints.complete()):
        try:
            if checkpoint.path.is_dir():
                if checkpoint_digest(checkpoint.path, world)[0] != checkpoint.sha256:
                    raise ArtifactError(f"checkpoint {checkpoint.path} does not match its recorded sha256")
                half_loaded = checkpoint
                return checkpoint, load_sharded(checkpoint.path, model, optimizer, world)
            state = load_checkpoint(checkpoint.path, checkpoint.sha256)
            half_loaded = checkpoint
            restore(model, optimizer, state, str(checkpoint.path))
            return checkpoint, state
        except ArtifactError:
            log.warning("checkpoint %s does not match its checksum; skipping it for an older one", checkpoint.name)
        except (OSError, RuntimeError, ValueError) as e:
            log.warning("checkpoint %s is unreadable (%s); trying an older one", checkpoint.name, e)
    if half_loaded is not None:
        raise StageFailed(f"checkpoint {half_loaded.path} failed while it was loaded into the model, and no older checkpoint could "
                          "be read: the run cannot start fresh from a half-loaded model; remove the work directory's checkpoints "
                          "to train from the start, or repair them")
    return None


def load_sharded(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, world: World) -> dict[str, Any]:
    """Read a sharded checkpoint's model and optimizer state into `model` and `optimizer` as they are laid out (each rank
    its shards), and return the rest of its state, read whole by every rank (it is small). DCP is imported here, where a
    sharded checkpoint is read: with DTensor it costs 0.8 s of imports, which a run of file checkpoints never needs. DCP's
    own error (a BaseException) comes out as a RuntimeError, so that `resume` tries an older checkpoint."""
    from torch.distributed.checkpoint import CheckpointException

    try:
        return _read_sharded(path, model, optimizer, world)
    except CheckpointException as e:
        raise RuntimeError(str(e)) from e


def _read_sharded(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, world: World) -> dict[str, Any]:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    metadata = FileSystemReader(path).read_metadata()
    saved = metadata.state_dict_metadata
    live = model.state_dict()
    check_shape(str(path), {key.removeprefix(MODEL): tuple(value.size) for key, value in saved.items()
                            if key.startswith(MODEL) and isinstance(value, TensorStorageMetadata)},
                {key: tuple(value.shape) for key, value in live.items()})
    params = [p for group in optimizer.param_groups for p in group["params"]]
    slots: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in saved.items():
        if key.startswith(SLOTS) and isinstance(value, TensorStorageMetadata):
            index, slot = key.removeprefix(SLOTS).split(".", 1)
            param, dtype = params[int(index)], value.properties.dtype
            # a slot shaped like its parameter (Adam's moments) is sharded like it; a scalar (the step count) is whole
            like = tuple(value.size) == tuple(param.shape)
            slots.setdefault(int(index), {})[slot] = torch.zeros_like(param, dtype=dtype) if like else torch.zeros(value.size, dtype=dtype)
    target = {"model": live, "optimizer": {"state": slots}}
    rest: dict[str, Any] = {}
    others = {key for key in saved if not key.startswith((MODEL, SLOTS))}
    with warnings.catch_warnings():  # one process without a process group is a world of one, as meant
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
        dcp_load(target, storage_reader=FileSystemReader(path), planner=DefaultLoadPlanner(), no_dist=world.size == 1)
        _load_state_dict(rest, storage_reader=FileSystemReader(path), planner=_EmptyStateDictLoadPlanner(keys=others), no_dist=True)
    model.load_state_dict(target["model"])
    optimizer.load_state_dict({"state": slots, "param_groups": implementation_here(rest.pop("optimizer")["param_groups"], optimizer)})
    return rest
