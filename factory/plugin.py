"""The public plugin API: everything a package that extends the factory may use, in one module.

A plugin package declares stage kinds (`model_factory.stages`), source kinds (`model_factory.sources`), architectures
(`model_factory.models`), benchmarks (`model_factory.benchmarks`) and document filters (`model_factory.filters`) through
entry points, and imports the factory only
from here: the rest of `factory` is private and may change between releases (an import-linter contract,
`examples/importlinter.toml`, keeps the shipped plugins in `examples/` on this surface). `docs/plugins.md` walks through
writing each of them.

Light to import, as reading the registry imports every plugin: what needs torch or pyiceberg is imported by the
functions that use it, when a stage runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from factory.config.architectures import ModelArch
from factory.config.data_sections import SourceConfig
from factory.config.filter_kinds import DocumentFilter
from factory.config.kinds import DatasetNeed, MetricsPlot, Placement, StageKind, TableNeed, as_resources_say, one_rank
from factory.config.schema import Experiment, ModelConfig, TrainedModel, TrainingSection
from factory.config.section import GrownSection, Section
from factory.config.source_cache import source_cache
from factory.config.source_kinds import DataPath, SourceKind
from factory.errors import ConfigError, PluginError, StageFailed
from factory.evals.base import Benchmark, EvalInputs, Score
from factory.runtime.context import StageContext
from factory.stages.trainer import TrainingInputs, training_kind
from factory.train.distributed import World

if TYPE_CHECKING:
    import torch

    from factory.train.records import SavedCheckpoint

__all__ = [
    "PAD", "REFERENCE", "as_resources_say", "Batch", "Benchmark", "checkpoints_of", "ConfigError", "DataPath",
    "DatasetNeed", "DocumentFilter", "EvalInputs", "Experiment", "final_weights", "GrownSection", "HFLayout", "load_weights", "LoaderState", "MetricsPlot",
    "ModelArch", "ModelConfig", "one_rank", "Placement", "PluginError", "read_dataset", "save_final", "Score", "Section",
    "sequence_log_probs", "source_cache", "SourceConfig", "SourceKind", "StageContext", "StageFailed", "StageKind",
    "TableNeed", "TrainedModel", "training_kind", "TrainingInputs", "TrainingSection", "World",
]
PAD = -1
"""The target of a position the loss ignores (a prompt's tokens, padding): `Batch.y` holds it there."""
REFERENCE = "reference"
"""The frozen model a training kind may ask for (`frozen=(REFERENCE,)`): a copy of the weights it starts from."""


def __getattr__(name: str) -> Any:
    """The names that need torch (`Batch`, `LoaderState`, `HFLayout`, `sequence_log_probs`), imported when first read, so that reading
    the registry (which imports every plugin) stays light."""
    if name in ("Batch", "LoaderState"):
        from factory.data import loader

        return getattr(loader, name)
    if name == "HFLayout":
        from factory.models.hf_layout import HFLayout

        return HFLayout
    if name == "sequence_log_probs":
        from factory.train.objective import sequence_log_probs

        return sequence_log_probs
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def read_dataset(ctx: StageContext, dataset: str, columns: tuple[str, ...]) -> list[dict[str, Any]]:
    """The rows of a dataset of the file the kind declared (`datasets=`), at the version its upstream `filtered_datasets`
    stage wrote, with `columns`, in the version's order (a training kind's batch source has them as `inputs.rows`)."""
    from factory.data.catalog import open_catalog
    from factory.stages.training import dataset_rows

    return dataset_rows(ctx, open_catalog(ctx.request.catalog), dataset, columns)


def final_weights(ctx: StageContext, stage: str) -> dict[str, torch.Tensor]:
    """The final weights of an upstream training stage (`pretrain`, `sft`, a plugin's), of the model made elsewhere the
    stage starts from (`base`), or of the checkpoint `model.from_hf` names (`from_hf`)."""
    from factory.stages.training import final_weights as weights_of

    return weights_of(ctx, stage)


def checkpoints_of(ctx: StageContext, stage: str, last: int | None = None) -> list[SavedCheckpoint]:
    """The kept checkpoints of an upstream training stage, oldest first (`last`: the newest that many): each with its
    `step`, `path`, `sha256` and `metrics`. Their records are read alone, and only the checkpoints returned are on local
    disk (from an object store: each fetched alone, not the whole training artifact)."""
    import dataclasses

    from factory.train.records import kept_in

    if last is not None and last < 1:
        raise ValueError(f"checkpoints_of: last must be 1 or more, not {last}")
    manifest = ctx.upstream_manifest(stage)
    kept = kept_in(ctx.registry, manifest)
    chosen = kept[-last:] if last is not None else kept
    return [dataclasses.replace(checkpoint, path=ctx.registry.fetch(manifest, checkpoint.path.name)) for checkpoint in chosen]


def load_weights(checkpoint: SavedCheckpoint) -> dict[str, torch.Tensor]:
    """The model weights of one checkpoint, its checksum verified."""
    from factory.train.checkpoint import load_checkpoint

    state = load_checkpoint(checkpoint.path, checkpoint.sha256)
    return state["model"] if "model" in state else state


def save_final(ctx: StageContext, weights: dict[str, torch.Tensor], *, step: int, tokens_seen: int = 0) -> dict[str, Any]:
    """Save `weights` as this stage's one checkpoint (at `step`), and the record that names it final: evaluated as a
    `checkpoints` partition, exported by the model stage when this stage ends the chain. Returns summary figures."""
    from factory.config.kinds import TOKENIZER, provider
    from factory.models.build import build_model
    from factory.models.tokenizer import load_tokenizer
    from factory.registry.layout import TOKENIZER_FILE
    from factory.stages.training import write_run
    from factory.train.checkpoint import CheckpointDir, RetentionPolicy
    from factory.train.records import published

    vocab_size = load_tokenizer(ctx.upstream(provider(TOKENIZER).name) / TOKENIZER_FILE).get_vocab_size()
    model = build_model(ctx.settings.model, vocab_size, ctx.settings.seed)
    model.load_state_dict(weights)  # a wrong shape is said here, not by whoever loads it next
    CheckpointDir(ctx.out, RetentionPolicy(keep_last=1, best_metric=None), ctx.log).save(
        step, {"model": weights, "step": step}, {"tokens_seen": tokens_seen}, final=True)
    parameters = sum(p.numel() for p in model.parameters())
    write_run(ctx, ctx.settings.model, vocab_size, steps=step, tokens_seen=tokens_seen, parameters=parameters,
              checkpoints=tuple(c.path.name for c in published(ctx.out)))
    return {"steps": step, "parameters": parameters, "checkpoints": 1}
