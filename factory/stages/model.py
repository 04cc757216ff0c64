"""The `model` kind: the final weights of the last training stage (rl, sft or pretrain), exported with their config and
tokenizer (and the chat template of an sft on a table) as a self-contained model.

Light to import: its run function imports torch and the exporter when it runs.
"""

from __future__ import annotations

import json
import shutil
from typing import Any

from factory.config.kinds import StageKind
from factory.config.schema import ModelConfig
from factory.config.section import Section
from factory.registry.layout import CHAT_TEMPLATE_FILE, MODEL_CONFIG, RUN_FILE, TOKENIZER_FILE
from factory.runtime.context import StageContext


class ModelSettings(Section):
    """The model stage exports what it reads: no settings of its own."""


def run(ctx: StageContext) -> dict[str, Any]:
    """Export the final weights with their config, tokenizer and chat template (when sft had one): a self-contained model."""
    from factory.config.stages import TRAINING_STAGES  # derived from the registry: read when it runs, not while it is built
    from factory.models.build import export_model
    from factory.train.pretrain import load_weights

    trained = [name for name in TRAINING_STAGES if name in ctx.request.spec.upstream][-1]  # the last training stage run
    checkpoints = ctx.upstream(trained)
    record = json.loads((checkpoints / RUN_FILE).read_text())
    export_model(ModelConfig.model_validate(record["model"]), load_weights(checkpoints / record["final"]), ctx.out)
    tokenizer_path = ctx.upstream("tokenizer") / TOKENIZER_FILE
    shutil.copyfile(tokenizer_path, ctx.out / TOKENIZER_FILE)
    (ctx.out / MODEL_CONFIG).write_text(json.dumps(record, indent=2, sort_keys=True))
    if (template := checkpoints / CHAT_TEMPLATE_FILE).is_file():  # prompts the model as it was fine-tuned
        shutil.copyfile(template, ctx.out / CHAT_TEMPLATE_FILE)
    return {"parameters": record["parameters"], "tokens_seen": record["tokens_seen"], "vocab_size": record["vocab_size"]}


MODEL = StageKind(
    name="model", run="factory.stages.model:run", reads=("pretrain", "sft", "rl", "tokenizer"), exports_model=True,
    present=lambda e: e.pretrain is not None or e.base is not None, settings=ModelSettings, fingerprint=lambda e: ModelSettings(),
    artifact=frozenset({"torch"}), imports=("factory.models.build", "factory.stages.training", "factory.train.pretrain"),
    description="The final weights of the last training stage (rl, sft or pretrain), exported with their config and tokenizer.",
)
