"""The `rl` kind: GRPO from code-execution feedback, starting from the SFT model (or the pretrained one without sft).

Actors sample completions and score them in the sandbox, learners update; its checkpoints are `checkpoints`
partitions like pretraining's. Light to import: its run function imports torch and the GRPO loop when it runs.
"""

from __future__ import annotations

from typing import Any

from pydantic import field_serializer

from factory.config.kinds import MetricsPlot, Placement, StageKind
from factory.config.schema import Experiment, RLConfig, TrainedModel
from factory.errors import ConfigError
from factory.runtime.context import StageContext
from factory.stages.post_training import POST_TRAINING_READS, POST_TRAINING_TASKS, task_table

RL_PLACEMENT = {"learners", "actors"}
"""RL knobs that say where work runs, not what it computes: left out of the fingerprint."""
NOT_COMPUTED = {*RL_PLACEMENT, "from"}
"""Left out of the fingerprint: placement, and how the file named the model it starts from (its digest is an input)."""


class RLSettings(TrainedModel):
    """GRPO; where its learners and actors run is placement, not part of what it computes."""

    rl: RLConfig

    @field_serializer("rl")
    def _without_placement(self, rl: RLConfig) -> dict[str, Any]:
        return {key: value for key, value in rl.model_dump(mode="json").items() if key not in NOT_COMPUTED}


def _settings(experiment: Experiment) -> RLSettings:
    return RLSettings(**TrainedModel.fields_of(experiment), rl=experiment.rl)


def _placement(experiment: Experiment) -> Placement:
    """RL runs its learners and actors as ranks of one node, each on a GPU of the `resources.gpus` it is given (rank r on
    `cuda:r mod gpus`), else on the CPU. They meet over NCCL when every rank has a GPU of its own (the weights then go GPU
    to GPU), and over gloo otherwise (on the CPU, or ranks that share GPUs: gloo moves CUDA tensors through the host)."""
    rl = experiment.rl
    ranks, gpus = rl.learners + rl.actors, experiment.resources.gpus
    return Placement(processes=ranks, roles={"learners": rl.learners, "actors": rl.actors, "backend": "nccl" if gpus >= ranks else "gloo"},
                     gpus=gpus)


def run(ctx: StageContext) -> dict[str, Any]:
    """GRPO from the SFT model (or the pretrained one when there is no sft stage) on the train split's tasks."""
    from factory.post.rl import train_rl
    from factory.post.sft import read_tasks
    from factory.devices import describe
    from factory.post.weightsync import roles_from
    from factory.stages.training import (
        carry_chat_template, final_weights, post_training_inputs, publish_checkpoints, starts_from, tracked_run, write_run,
    )

    model_config, tokenizer, eos_id, catalog = post_training_inputs(ctx)
    config = ctx.settings.rl
    rows = read_tasks(catalog, config.tasks, "train")
    if len(rows) < config.prompts_per_step:
        raise ConfigError(f"{config.tasks} has {len(rows)} train tasks, fewer than rl.prompts_per_step ({config.prompts_per_step}): "
                          "lower it or generate more tasks")
    world = ctx.world
    learners, actors = (ctx.request.placement.get("learners", 1), ctx.request.placement.get("actors", 0)) if world.size > 1 else (1, 0)
    if learners + actors != world.size:
        raise ConfigError(f"rl asks for {learners} learner(s) and {actors} actor(s), but the stage was started with {world.size} ranks")
    roles = roles_from(world.rank, learners, actors)
    start = starts_from(ctx, "sft", "pretrain")
    work = ctx.registry.work(ctx.request.spec.fingerprint)
    if world.is_main:
        ctx.log.info("GRPO from the %s model on %d tasks: %d learner(s), %d actor(s)", start, len(rows), roles.learners, roles.actors)
    with tracked_run(ctx, world, work) as (tracker, report):
        result = train_rl(rows, tokenizer, eos_id, final_weights(ctx, start), model_config, config, ctx.settings.seed, roles, work,
                          ctx.log, report, on_checkpoint=ctx.checkpoint, device=world.device)
    if not world.is_main:
        return {}
    publish_checkpoints(ctx, work, result.checkpoints)
    carry_chat_template(ctx, start)
    write_run(ctx, model_config, tokenizer.get_vocab_size(), steps=result.steps, tokens_seen=0, parameters=result.parameters,
              checkpoints=result.checkpoints)
    last = {f"last_{key}": value for key, value in result.last.items() if key != "step"}
    return {
        "steps": result.steps, "started_from": start, "resumed_from_step": result.resumed_from, "learners": roles.learners,
        "actors": roles.actors, "device": describe(world.device), "checkpoints": len(result.checkpoints), "parameters": result.parameters, "tracker_run": tracker.id,
        "tracker_url": tracker.url, "train_seconds": round(result.seconds, 2), "tasks": config.tasks, **last,
    }


RL = StageKind(
    name="rl", run="factory.stages.rl:run", reads=(*POST_TRAINING_READS, "sft"), section="rl",
    plot=MetricsPlot(title="Reinforcement learning", file="rl.png", alt="RL rewards", curves="rewards"),
    checkpoints=True, placement=_placement, artifact=frozenset({"torch"}), extra_inputs=(POST_TRAINING_TASKS,),
    settings=RLSettings, fingerprint=_settings, tables=task_table("rl"),
    imports=("factory.devices", "factory.post.rl", "factory.post.sft", "factory.post.weightsync", "factory.stages.training",
             "factory.train.distributed"),
    description="GRPO from code-execution feedback, starting from the SFT model: actors sample and score, learners "
                "update; checkpoints are `checkpoints` partitions.",
)
