"""The `pretrain` kind: a GPT trained on packed token sequences from the blend, its kept checkpoints evaluated.

Light to import: its run function imports torch and the training loop (`factory.stages.training`) when it runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any

from pydantic import SerializerFunctionWrapHandler, model_serializer

from factory.config.control import ControlConfig
from factory.config.kinds import MetricsPlot, StageKind, as_resources_say
from factory.config.schema import Experiment, PretrainConfig, TrainedModel
from factory.config.stages import FROM_HF
from factory.registry.layout import TOKENIZER_FILE
from factory.runtime.context import StageContext

if TYPE_CHECKING:
    from factory.data.loader import Batch, LoaderState


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


def run(ctx: StageContext) -> dict[str, Any]:
    """Pretrain the model on packed token sequences from the blend's train split (from the weights of `model.from_hf` when
    it names a checkpoint); a relaunch resumes it."""
    from factory.data.catalog import open_catalog
    from factory.data.loader import build_loader
    from factory.models.tokenizer import end_of_text, load_tokenizer
    from factory.stages.training import carry_chat_template, train_stage
    from factory.train.distributed import world_from_env

    settings = ctx.settings
    model_config, config = settings.model, settings.pretrain
    tokenizer_file = ctx.upstream("tokenizer") / TOKENIZER_FILE
    tokenizer = load_tokenizer(tokenizer_file)
    catalog = open_catalog(ctx.request.catalog)
    eos_id = end_of_text(tokenizer, tokenizer_file)
    loader = build_loader(catalog, ctx.blend(), tokenizer, eos_id, model_config.context, settings.seed, settings.stream)
    world = world_from_env()

    def data(state: LoaderState | None) -> Iterator[Batch]:
        return loader.batches(config.batch_size, state=state, rank=world.rank, world=world.size)

    control = settings.control
    validation: list[Batch] = []
    if control is not None:
        held_out = build_loader(catalog, ctx.blend(), tokenizer, eos_id, model_config.context, settings.seed, settings.stream, "validation")
        validation = list(islice(held_out.batches(config.batch_size), control.eval_batches))
    init = None
    if model_config.from_hf is not None:  # continued pretraining of a checkpoint
        from factory.models.hf_import import import_weights

        init = import_weights(model_config.from_hf)
    summary = train_stage(ctx, "pretrain", model_config, config, tokenizer.get_vocab_size(), data, control=control, validation=validation,
                          init=init)
    if summary and model_config.from_hf is not None:  # the checkpoint's chat template stays with the model it becomes
        carry_chat_template(ctx, FROM_HF)
    return summary


PRETRAIN = StageKind(
    name="pretrain", run="factory.stages.pretrain:run", reads=("blend", "tokenizer"), section="pretrain", main_training=True,
    plot=MetricsPlot(title="Training", file="training.png", alt="training loss"),
    checkpoints=True, placement=as_resources_say, artifact=frozenset({"torch"}), settings=PretrainSettings, fingerprint=_settings,
    imports=("factory.data.catalog", "factory.data.loader", "factory.models.hf_import", "factory.models.tokenizer", "factory.stages.training",
             "factory.train.distributed"),
    description="Pretraining run: a GPT trained on packed token sequences from the blend; its kept checkpoints are "
                "`checkpoints` partitions.",
)
