"""The `sft` kind: supervised fine-tuning of the pretrained model on code-execution pairs or on any table version
(`sft.data`, rendered by its chat template, else by the one of the model it starts from), loss on completions only.

A training kind like any plugin's (`factory.stages.trainer.training_kind`): its batch source is below, its loss the
next-token one over completion tokens, and the platform's loop trains it. It starts from the final weights of `pretrain`
(or of a model made elsewhere, or of the checkpoint `model.from_hf` names) and writes checkpoints as pretraining does, so
they are `checkpoints` partitions and get evaluated. Light to import: its batch source imports the tables when it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from factory.config.kinds import DatasetNeed, MetricsPlot, TableNeed
from factory.config.schema import Experiment, SFTConfig
from factory.config.sft_data import SFTData
from factory.registry.layout import CHAT_TEMPLATE_FILE
from factory.runtime.context import StageContext
from factory.stages.post_training import POST_TRAINING_TASKS, task_table
from factory.stages.trainer import FILTERED, BatchSource, TrainingInputs, training_kind

if TYPE_CHECKING:
    from factory.data.loader import LoaderState


def batches(inputs: TrainingInputs) -> BatchSource:
    """The pairs of the train split of the task table, or the rows of `sft.data` rendered by its chat template, as global
    batches of examples whose loss counts completion (assistant) tokens only."""
    from factory.data.catalog import open_catalog
    from factory.data.tables import parse_ref, resolve
    from factory.post.sft import encode_examples, read_tasks, sft_batches

    ctx, config = inputs.ctx, inputs.section
    catalog = open_catalog(ctx.request.catalog)
    if config.data is None:
        examples = encode_examples(read_tasks(catalog, config.tasks, "train"), inputs.tokenizer, inputs.eos_id, inputs.context)
        read = {"tasks": config.tasks, "tasks_snapshot": resolve(catalog, *parse_ref(config.tasks))}
        ctx.log.info("fine-tuning on %d prompt/completion pairs from %s (train split)", len(examples), config.tasks)
    else:
        from factory.post.chat import chat_examples, read_rows
        from factory.stages.versions import dataset_version

        ref = config.data.table or dataset_version(ctx, FILTERED, str(config.data.dataset))
        snapshot, rows = read_rows(catalog, config.data, ref)
        template, origin = chat_template(ctx, config.data, inputs.start)
        ctx.log.info("rendering the rows with the chat template of %s", origin)
        examples = chat_examples(rows, config.data.model_copy(update={"chat_template": template}), inputs.tokenizer, inputs.eos_id,
                                 inputs.context)
        read = {"data": ref, "data_snapshot": snapshot, "chat_template": origin}
        ctx.log.info("fine-tuning on %d of %d rows of %s (%s)", len(examples), len(rows), ref, config.data.format)
        if inputs.world.is_main:  # the template the model is taught with: exported with it
            (ctx.out / CHAT_TEMPLATE_FILE).write_text(template)
    inputs.summary.update({"pairs": len(examples), **read})
    world = inputs.world

    def source(state: LoaderState | None):
        return sft_batches(examples, config.batch_size, inputs.settings.seed, inputs.eos_id, state, world.rank, world.size)

    return source


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


def _datasets(config: SFTConfig) -> list[DatasetNeed]:
    """The dataset of the file `sft.data` names, with the columns it maps."""
    if config.data is None or config.data.dataset is None:
        return []
    return [DatasetNeed(where=("data", "dataset"), dataset=config.data.dataset, columns=config.data.columns)]


SFT = training_kind(
    name="sft", config=SFTConfig, batches=batches, starts_from=("pretrain",), datasets=_datasets,
    plot=MetricsPlot(title="Fine-tuning (SFT)", file="sft.png", alt="SFT loss"), extra_inputs=(POST_TRAINING_TASKS,), tables=_tables,
    imports=("factory.data.catalog", "factory.data.tables", "factory.post.chat", "factory.post.sft"),
    description="Supervised fine-tuning of the pretrained model on code-execution pairs or any table (loss on completions only); its "
                "checkpoints are `checkpoints` partitions.",
)
