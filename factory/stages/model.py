"""The `model` kind: the final weights of the last training stage of the chain (rl, sft, pretrain or a plugin's training
kind; or the one the file's `export` names), exported with their config and
tokenizer (and the chat template the model was fine-tuned or imported with) as a self-contained model: a Hugging Face
model directory when the architecture has a layout there (llama; gpt with learned positions), the factory's own files
otherwise.

Light to import: its run function imports torch and the exporter when it runs.
"""

from __future__ import annotations

import json
import shutil
from typing import Any

from factory.config.kinds import StageKind, chain_ends_twice, exported, trains
from factory.config.schema import Experiment, ModelConfig
from factory.config.section import GrownSection
from factory.errors import ConfigError
from factory.registry.layout import CHAT_TEMPLATE_FILE, MODEL_CONFIG, RUN_FILE, TOKENIZER_FILE
from factory.runtime.context import StageContext


class ModelSettings(GrownSection):
    """The model stage exports what it reads: the last training stage of the chain, or the one the file names."""

    UNSET_LEFT_OUT = ("export",)  # files that leave the choice to the chain keep their fingerprints

    export: str | None = None
    """The training kind whose final weights it exports, when the file names one (`export`)."""


def exported_kind(experiment: Experiment) -> str:
    """The training kind whose final weights `experiment`'s model stage exports: the one its `export` names, else the last
    training stage of its chain; a ConfigError when two end it and the file does not choose."""
    from factory.config.stages import stages_of

    runs = stages_of(experiment)
    if experiment.export is not None:
        return experiment.export
    last = exported(runs)
    if len(last) > 1:
        raise ConfigError(chain_ends_twice(last))
    return last[0]


def _settings(experiment: Experiment) -> ModelSettings:
    exported_kind(experiment)  # two candidates and no choice: refused when planned
    return ModelSettings(export=experiment.export)


def run(ctx: StageContext) -> dict[str, Any]:
    """Export the final weights with their config, tokenizer and chat template (when the training stage kept one): a
    self-contained model, in a Hugging Face layout when its architecture has one."""
    from factory.models.build import export_model, hugging_face_layout
    from factory.models.hf_export import export_hugging_face
    from factory.train.pretrain import load_weights

    trained = ctx.settings.export or exported(ctx.request.spec.upstream)[0]
    record = json.loads(ctx.upstream_file(trained, RUN_FILE).read_text())  # the files it needs, not every kept checkpoint
    config, weights = ModelConfig.model_validate(record["model"]), load_weights(ctx.upstream_file(trained, record["final"]))
    tokenizer_path = ctx.upstream_tokenizer()
    template = ctx.upstream_file(trained, CHAT_TEMPLATE_FILE)  # prompts the model as it was fine-tuned
    if template.is_file():
        shutil.copyfile(template, ctx.out / CHAT_TEMPLATE_FILE)
    layout = hugging_face_layout(config, weights, record["vocab_size"])
    if isinstance(layout, str):
        ctx.log.info(f"no Hugging Face export: {layout}")
        export_model(config, weights, ctx.out)
        shutil.copyfile(tokenizer_path, ctx.out / TOKENIZER_FILE)
        (ctx.out / MODEL_CONFIG).write_text(json.dumps(record, indent=2, sort_keys=True))
        hugging_face = f"none: {layout}"
    else:
        chat_template = template.read_text() if template.is_file() else None
        export_hugging_face(layout, weights, ctx.out, tokenizer=tokenizer_path, context=config.context, record=record,
                            chat_template=chat_template)
        hugging_face = layout.architecture
    return {"parameters": record["parameters"], "tokens_seen": record["tokens_seen"], "vocab_size": record["vocab_size"],
            "hugging_face": hugging_face}


MODEL = StageKind(
    name="model", run="factory.stages.model:run", reads=("pretrain", "sft", "rl", "tokenizer"), exports_model=True,
    present=trains, settings=ModelSettings, fingerprint=_settings,
    artifact=frozenset({"torch"}), imports=("factory.models.build", "factory.models.hf_export", "factory.stages.training", "factory.train.pretrain"),
    description="The final weights of the last training stage (or the one the file's `export` names), exported with their config and "
                "tokenizer.",
)
