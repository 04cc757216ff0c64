"""The `pretrain` kind: a GPT trained on packed token sequences from the blend, its kept checkpoints evaluated.

A training kind like any plugin's (`factory.stages.trainer.training_kind`): its batch source is below, its loss the
next-token one, and the platform's loop trains it from the seed (or from the weights of `model.from_hf`), with the file's
control rules. Light to import: its batch source imports the loader when it runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any

from pydantic import SerializerFunctionWrapHandler, model_serializer

from factory.config.control import ControlConfig
from factory.config.kinds import MetricsPlot
from factory.config.schema import Experiment, PretrainConfig, TrainedModel
from factory.stages.trainer import BatchSource, TrainingInputs, training_kind

if TYPE_CHECKING:
    from factory.data.loader import Batch, BlendLoader, LoaderState


class PretrainSettings(TrainedModel):
    """Pretraining: the schedule, and the control rules when there are any."""

    pretrain: PretrainConfig
    control: ControlConfig | None = None

    @model_serializer(mode="wrap")
    def _control_only_when_present(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dump = handler(self)
        if self.control is None:  # recipes without rules keep the fingerprints they had before rules existed
            dump.pop("control", None)
        return dump


def _settings(experiment: Experiment) -> PretrainSettings:
    return PretrainSettings(**TrainedModel.fields_of(experiment), pretrain=experiment.pretrain, control=experiment.control)


def batches(inputs: TrainingInputs) -> BatchSource:
    """Packed token sequences from the blend's train split, this rank's slice of each global batch; with control rules,
    the whole held-out batches their in-loop evaluations score."""
    from factory.data.catalog import open_catalog
    from factory.data.loader import build_loader

    ctx, settings, config = inputs.ctx, inputs.settings, inputs.section
    catalog = open_catalog(ctx.request.catalog)

    def loader(split: str = "train") -> BlendLoader:
        return build_loader(catalog, ctx.blend(), inputs.tokenizer, inputs.eos_id, inputs.context, settings.seed, settings.stream, split)

    if settings.control is not None:
        inputs.validation = list(islice(loader("validation").batches(config.batch_size), settings.control.eval_batches))
    train, world = loader(), inputs.world

    def source(state: LoaderState | None) -> Iterator[Batch]:
        return train.batches(config.batch_size, state=state, rank=world.rank, world=world.size)

    return source


PRETRAIN = training_kind(
    name="pretrain", config=PretrainConfig, batches=batches, starts_from=(), starts_from_model=False, settings=PretrainSettings,
    fingerprint=_settings, main_training=True, plot=MetricsPlot(title="Training", file="training.png", alt="training loss"),
    imports=("factory.data.catalog", "factory.data.loader", "factory.models.hf_import", "factory.models.tokenizer"),
    description="Pretraining run: a GPT trained on packed token sequences from the blend; its kept checkpoints are "
                "`checkpoints` partitions.",
)
