"""The `sft` kind: supervised fine-tuning of the pretrained model on code-execution pairs or on any table version
(`sft.data`, rendered by its chat template, else by the one of the model it starts from), loss on completions only.

It starts from the final weights of `pretrain` (or of a model made elsewhere, or of the checkpoint `model.from_hf` names)
and writes checkpoints as pretraining does, so they are `checkpoints` partitions and get evaluated. Light to import: its run function imports torch and the training loop when it runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pydantic import field_serializer

from factory.config.kinds import DatasetNeed, MetricsPlot, StageKind, TableNeed, as_resources_say
from factory.config.schema import Experiment, SFTConfig, TrainedModel
from factory.config.sft_data import SFTData
from factory.registry.layout import CHAT_TEMPLATE_FILE
from factory.runtime.context import StageContext
from factory.stages.post_training import POST_TRAINING_READS, POST_TRAINING_TASKS, task_table

DATASETS_READ = "filtered_datasets"
"""The data stage whose version of `sft.data.dataset` SFT reads."""

if TYPE_CHECKING:
    from factory.data.loader import Batch, LoaderState


class SFTSettings(TrainedModel):
    """Supervised fine-tuning; the model it starts from is its input (`base`), not how the file named it (`from`)."""

    sft: SFTConfig

    @field_serializer("sft")
    def _without_from(self, sft: SFTConfig) -> dict[str, Any]:
        return {key: value for key, value in sft.model_dump(mode="json").items() if key != "from"}


def _settings(experiment: Experiment) -> SFTSettings:
    return SFTSettings(**TrainedModel.fields_of(experiment), sft=experiment.sft)


def run(ctx: StageContext) -> dict[str, Any]:
    """Fine-tune the pretrained model on the train split of the task table, or on the rows of `sft.data` rendered by its
    chat template; the loss counts completion (assistant) tokens only."""
    from factory.data.tables import parse_ref, resolve
    from factory.post.sft import encode_examples, read_tasks, sft_batches
    from factory.stages.training import carry_chat_template, final_weights, post_training_inputs, starts_from, train_stage
    from factory.train.distributed import world_from_env

    model_config, tokenizer, eos_id, catalog = post_training_inputs(ctx)
    config = ctx.settings.sft
    start = starts_from(ctx, "pretrain")
    template = None
    if config.data is None:
        examples = encode_examples(read_tasks(catalog, config.tasks, "train"), tokenizer, eos_id, model_config.context)
        read = {"tasks": config.tasks, "tasks_snapshot": resolve(catalog, *parse_ref(config.tasks))}
        ctx.log.info("fine-tuning on %d prompt/completion pairs from %s (train split)", len(examples), config.tasks)
    else:
        from factory.post.chat import chat_examples, read_rows
        from factory.stages.versions import dataset_version

        ref = config.data.table or dataset_version(ctx, DATASETS_READ, str(config.data.dataset))
        snapshot, rows = read_rows(catalog, config.data, ref)
        template, origin = chat_template(ctx, config.data, start)
        ctx.log.info("rendering the rows with the chat template of %s", origin)
        examples = chat_examples(rows, config.data.model_copy(update={"chat_template": template}), tokenizer, eos_id, model_config.context)
        read = {"data": ref, "data_snapshot": snapshot, "chat_template": origin}
        ctx.log.info("fine-tuning on %d of %d rows of %s (%s)", len(examples), len(rows), ref, config.data.format)
    world = world_from_env()

    def data(state: LoaderState | None) -> Iterator[Batch]:
        return sft_batches(examples, config.batch_size, ctx.settings.seed, eos_id, state, world.rank, world.size)

    summary = train_stage(ctx, "sft", model_config, config, tokenizer.get_vocab_size(), data, init=final_weights(ctx, start))
    if not summary:
        return summary
    if template is not None:  # the template the model was taught with: exported with it
        (ctx.out / CHAT_TEMPLATE_FILE).write_text(template)
    carry_chat_template(ctx, start)
    return {**summary, "started_from": start, "pairs": len(examples), **read}


def chat_template(ctx: StageContext, data: SFTData, start: str) -> tuple[str, str]:
    """The chat template the rows are rendered with, and where it comes from: `sft.data.chat_template`, else the one of the
    model the stage starts from (a Hugging Face checkpoint's ChatML, ...), else the format's default."""
    from factory.stages.training import starting_template

    if data.chat_template is not None:
        return data.chat_template, "sft.data.chat_template"
    if (carried := starting_template(ctx, start)) is not None:
        return carried
    return data.template, f"the factory's default for format {data.format!r} (sft.data.chat_template is unset)"


def _tables(experiment: Experiment) -> list[TableNeed]:
    """The table version `sft.data` pins with its mapped columns (none for a dataset of the file), or the task table (as
    `rl` reads it)."""
    data = experiment.sft.data if experiment.sft is not None else None
    if data is None:
        return task_table("sft")(experiment)
    return [TableNeed(where=("sft", "data", "table"), table=data.table, columns=data.columns)] if data.table is not None else []


def _datasets(experiment: Experiment) -> list[DatasetNeed]:
    """The dataset of the file `sft.data` names, with the columns it maps."""
    data = experiment.sft.data if experiment.sft is not None else None
    if data is None or data.dataset is None:
        return []
    return [DatasetNeed(where=("sft", "data", "dataset"), dataset=data.dataset, columns=data.columns)]


def _reads(experiment: Experiment) -> tuple[str, ...]:
    """The filtered datasets only when `sft.data` names a dataset of the file: other recipes keep their fingerprints."""
    data = experiment.sft.data if experiment.sft is not None else None
    return (*POST_TRAINING_READS, *([DATASETS_READ] if data is not None and data.dataset is not None else []))


SFT = StageKind(
    name="sft", run="factory.stages.sft:run", reads=(*POST_TRAINING_READS, DATASETS_READ), reads_in=_reads, section="sft",
    plot=MetricsPlot(title="Fine-tuning (SFT)", file="sft.png", alt="SFT loss"),
    checkpoints=True, placement=as_resources_say, artifact=frozenset({"torch"}), extra_inputs=(POST_TRAINING_TASKS,),
    settings=SFTSettings, fingerprint=_settings, tables=_tables, datasets=_datasets,
    imports=("factory.data.tables", "factory.post.chat", "factory.post.sft", "factory.stages.training", "factory.stages.versions",
             "factory.train.distributed"),
    description="Supervised fine-tuning of the pretrained model on code-execution pairs or any table (loss on completions only); its "
                "checkpoints are `checkpoints` partitions.",
)
