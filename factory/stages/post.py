"""The post-training stages: `sft` (fine-tuning on code-execution pairs) and `rl` (GRPO from execution feedback).

Both start from the final weights of the training stage before them and write checkpoints like
pretraining does, so their checkpoints are `checkpoints` partitions and get evaluated.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyiceberg.catalog import Catalog
from tokenizers import Tokenizer

from factory.config.schema import ModelConfig
from factory.data.catalog import open_catalog
from factory.data.loader import Batch, LoaderState
from factory.data.tables import parse_ref, resolve
from factory.errors import ConfigError
from factory.models.tokenizer import EOS, load_tokenizer
from factory.post.rl import train_rl
from factory.post.sft import encode_examples, read_tasks, sft_batches
from factory.post.weightsync import roles_from
from factory.runtime.context import TOKENIZER_FILE, StageContext
from factory.stages.runners import final_weights, publish_checkpoints, tracked_run, train_stage, write_run
from factory.train.distributed import world_from_env


def _inputs(ctx: StageContext) -> tuple[ModelConfig, Tokenizer, int, Catalog]:
    """What both post-training stages read: the model's shape, the tokenizer and its end-of-text id, the catalog."""
    tokenizer = load_tokenizer(ctx.upstream("tokenizer") / TOKENIZER_FILE)
    return ctx.settings.model, tokenizer, tokenizer.token_to_id(EOS), open_catalog(ctx.request.catalog)


def run_sft(ctx: StageContext) -> dict[str, Any]:
    """Fine-tune the pretrained model on the train split of the task table, loss on completion tokens only."""
    model_config, tokenizer, eos_id, catalog = _inputs(ctx)
    config = ctx.settings.sft
    examples = encode_examples(read_tasks(catalog, config.tasks, "train"), tokenizer, eos_id, model_config.context)
    world = world_from_env()
    ctx.log.info("fine-tuning on %d prompt/completion pairs from %s (train split)", len(examples), config.tasks)

    def data(state: LoaderState | None) -> Iterator[Batch]:
        return sft_batches(examples, config.batch_size, ctx.settings.seed, eos_id, state, world.rank, world.size)

    summary = train_stage(ctx, "sft", model_config, config, tokenizer.get_vocab_size(), data, init=final_weights(ctx, "pretrain"))
    if not summary:
        return summary
    return {**summary, "pairs": len(examples), "tasks": config.tasks, "tasks_snapshot": resolve(catalog, *parse_ref(config.tasks))}


def run_rl(ctx: StageContext) -> dict[str, Any]:
    """GRPO from the SFT model (or the pretrained one when there is no sft stage) on the train split's tasks."""
    model_config, tokenizer, eos_id, catalog = _inputs(ctx)
    config = ctx.settings.rl
    rows = read_tasks(catalog, config.tasks, "train")
    if len(rows) < config.prompts_per_step:
        raise ConfigError(f"{config.tasks} has {len(rows)} train tasks, fewer than rl.prompts_per_step ({config.prompts_per_step}): "
                          "lower it or generate more tasks")
    world = world_from_env()
    learners, actors = (ctx.request.placement.get("learners", 1), ctx.request.placement.get("actors", 0)) if world.size > 1 else (1, 0)
    if learners + actors != world.size:
        raise ConfigError(f"rl asks for {learners} learner(s) and {actors} actor(s), but the stage was started with {world.size} ranks")
    roles = roles_from(world.rank, learners, actors)
    start = "sft" if "sft" in ctx.request.spec.upstream else "pretrain"
    work = ctx.registry.work(ctx.request.spec.fingerprint)
    if world.is_main:
        ctx.log.info("GRPO from the %s model on %d tasks: %d learner(s), %d actor(s)", start, len(rows), roles.learners, roles.actors)
    with tracked_run(ctx, world, work) as (tracker, report):
        result = train_rl(rows, tokenizer, eos_id, final_weights(ctx, start), model_config, config, ctx.settings.seed, roles, work,
                          ctx.log, report, on_checkpoint=ctx.reporter.checkpoint)
    if not world.is_main:
        return {}
    publish_checkpoints(ctx, work, result.checkpoints)
    write_run(ctx, model_config, tokenizer.get_vocab_size(), steps=result.steps, tokens_seen=0, parameters=result.parameters,
              checkpoints=result.checkpoints)
    last = {f"last_{key}": value for key, value in result.last.items() if key != "step"}
    return {
        "steps": result.steps, "started_from": start, "resumed_from_step": result.resumed_from, "learners": roles.learners,
        "actors": roles.actors, "checkpoints": len(result.checkpoints), "parameters": result.parameters, "tracker_run": tracker.id,
        "tracker_url": tracker.url, "train_seconds": round(result.seconds, 2), "tasks": config.tasks, **last,
    }

