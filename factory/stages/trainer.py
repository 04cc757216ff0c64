"""Training kinds: a stage that trains a model with the platform's loop, declared by a batch source and a loss.

`training_kind(...)` builds the `StageKind` of such a stage, for the built-in fine-tuning and for a plugin's objective
(DPO, say) alike. The kind's section is a `TrainingSection` (the schedule knobs every training stage has, and `from`);
its settings are the model it trains (shape, seed, stream) and its section; it reads the blend and tokenizer (its
checkpoints are evaluated on the blend's held-out data), the training stages before it (it starts from the last one the
experiment runs, from the model `from` names, or from `model.from_hf`), and the filtered versions of the datasets it
declares. Its run function is the platform's (`factory.stages.training:run_training_kind`): it reads the inputs, builds
the batch source, and runs the loop with the kind's loss.

Light to import: reading the registry imports it; the loop, torch and the tables are imported when a stage runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import SerializerFunctionWrapHandler, create_model, model_serializer

from factory.config.kinds import DatasetNeed, MetricsPlot, StageKind, Training, as_resources_say
from factory.config.schema import Experiment, PretrainConfig, TrainedModel, TrainingSection
from factory.runtime.context import StageContext

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from factory.config.schema import ModelConfig
    from factory.data.loader import Batch, LoaderState
    from factory.train.distributed import World

STARTS_FROM = ("pretrain", "sft", "rl")
"""The built-in training kinds a training kind may start from (it starts from the last of them the file runs)."""
FILTERED = "filtered_datasets"
"""The data stage whose versions of its datasets a training kind reads."""
RUNNER = "factory.stages.training:run_training_kind"
RUNNER_IMPORTS = ("factory.stages.training", "factory.stages.versions", "factory.train.distributed")


class TrainingSettings(TrainedModel):
    """The settings of a training kind: the model it trains and its section, whose `from` is left out (the model it names
    is the stage's input `base`, by digest, so two names of one model give one fingerprint)."""

    @model_serializer(mode="wrap")
    def _without_from(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dump = handler(self)
        for name in type(self).model_fields:
            if isinstance(getattr(self, name), TrainingSection) and isinstance(dump.get(name), dict):
                dump[name].pop("from", None)
        return dump


@dataclass(kw_only=True)
class TrainingInputs:
    """What a training kind's batch source is built from (`batches(inputs)`), in the stage process."""

    ctx: StageContext
    """The stage's context: its request, upstream artifacts (`ctx.upstream(kind)`), log and staging directory (`ctx.out`,
    for files the artifact keeps beside the checkpoints)."""
    start: str
    """The input it starts from (`pretrain`, `sft`, `base` for a model made elsewhere, `from_hf`), or "" for the seed."""
    settings: Any
    """The stage's settings: `model`, `seed`, `stream` and the kind's section by its name."""
    section: PretrainConfig
    """The kind's own section, typed (a `TrainingSection`; pretraining's is `PretrainConfig`, which has no `from`)."""
    model: ModelConfig
    tokenizer: Tokenizer
    eos_id: int
    world: World
    """This process's rank and the world size: a source yields this rank's slice of each global batch."""
    log: logging.Logger
    rows: Callable[[str, tuple[str, ...]], list[dict[str, Any]]]
    """`rows(dataset, columns)`: the rows of a dataset the kind declared, at the version its `filtered_datasets` stage wrote,
    with those columns, in the version's order."""
    summary: dict[str, Any] = field(default_factory=dict)
    """What the source adds to the stage's summary (the manifest and the materialization): what it read, how many pairs."""
    validation: list[Batch] = field(default_factory=list)
    """Whole held-out batches the source sets for the control rules' in-loop evaluations (the settings' `control`)."""

    @property
    def context(self) -> int:
        """The model's context length in tokens."""
        return self.model.context


BatchSource = Callable[["LoaderState | None"], Iterator["Batch"]]


def training_kind(
    *,
    name: str,
    description: str,
    config: type[PretrainConfig],
    batches: str | Callable[[TrainingInputs], BatchSource],
    loss: str | Callable[..., Any] | None = None,
    frozen: tuple[str, ...] = (),
    datasets: Callable[[Any], Iterable[DatasetNeed]] | None = None,
    starts_from: tuple[str, ...] = STARTS_FROM,
    section: str | None = None,
    imports: tuple[str, ...] = (),
    plot: MetricsPlot | None = None,
    starts_from_model: bool = True,
    settings: type[TrainedModel] | None = None,
    fingerprint: Callable[[Experiment], TrainedModel] | None = None,
    **declared: Any,
) -> StageKind:
    """The `StageKind` of a stage the platform's training loop runs.

    `config`: the section's type (a `TrainingSection`); `batches(inputs)`: the batch source; `loss(model, x, y, frozen,
    config)`: the summed loss of one micro-batch (None: next-token cross-entropy); `frozen`: the frozen models the loss reads
    (`reference`); `datasets(section)`: the datasets of the file it reads, with the columns it needs; `starts_from`: the
    training kinds it may start from (the last one the file runs); `imports`: the modules its batch source and loss
    import, for a warm interpreter to load ahead; `starts_from_model`: False for a kind that may train a model from the seed
    (pretraining). `settings` and `fingerprint` replace the default settings (the model, the seed, the stream and the
    section) when the stage reads more of the file (pretraining's control rules). Other `StageKind` fields pass through.
    """
    section = section or name
    settings = settings or create_model(f"{config.__name__}Settings", __base__=TrainingSettings,
                                        __doc__=f"The settings of the {name} stage.", **{section: (config, ...)})

    def default_fingerprint(experiment: Experiment) -> TrainedModel:
        return settings(**TrainedModel.fields_of(experiment), **{section: getattr(experiment, section)})

    needs = _dataset_needs(section, datasets)

    def reads_in(experiment: Experiment) -> tuple[str, ...]:
        return ("blend", "tokenizer", *starts_from, *([FILTERED] if needs is not None and list(needs(experiment)) else []))

    return StageKind(
        name=name, description=description, run=RUNNER, section=section, config=config, settings=settings,
        fingerprint=fingerprint or default_fingerprint,
        reads=("blend", "tokenizer", *starts_from, *([FILTERED] if datasets is not None else [])), reads_in=reads_in, checkpoints=True,
        placement=as_resources_say, artifact=frozenset({"torch"}), imports=(*RUNNER_IMPORTS, *imports), plot=plot, datasets=needs,
        training=Training(batches=batches, loss=loss, frozen=frozen, starts_from_model=starts_from_model), **declared,
    )


def _dataset_needs(section: str, datasets: Callable[[Any], Iterable[DatasetNeed]] | None) -> Callable[[Experiment], list[DatasetNeed]] | None:
    """The kind's `datasets`, given the experiment (its section, when present), with key paths from the file's top."""
    if datasets is None:
        return None

    def needs(experiment: Experiment) -> list[DatasetNeed]:
        config = getattr(experiment, section, None)
        if config is None:
            return []
        return [DatasetNeed(where=(section, *need.where), dataset=need.dataset, columns=need.columns) for need in datasets(config)]

    return needs

