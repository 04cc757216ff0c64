"""The `average` stage kind: the average of the last K kept checkpoints of an experiment's last training stage.

Averaging the weights of the last few checkpoints (uniformly, or exponentially weighted towards the newest) is a
cheap way to a better model for small-batch runs, whose weights keep jittering around a minimum. The averaged
weights are saved as one checkpoint of this stage, so the factory evaluates them like any other, the
leaderboard ranks them beside the checkpoints they came from, and the model stage exports them (the stage ends
the training chain). It imports the factory only through its public plugin API, `factory.plugin`.

Everything the factory needs is in `AVERAGE` below; the package's `model_factory.stages` entry point names it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from factory.plugin import ConfigError, Experiment, Section, StageContext, StageKind, TrainedModel, checkpoints_of, load_weights, save_final

STARTS_FROM = ("rl", "sft", "pretrain")
"""The training stages it may average, newest first: it averages the last one the experiment runs."""


class AverageConfig(Section):
    """Which checkpoints to average, and how."""

    last: int = Field(2, ge=2, le=100)
    """How many of the training stage's last kept checkpoints to average (keep at least as many: `keep_last`)."""
    method: Literal["uniform", "exponential"] = "uniform"
    """`uniform`: every checkpoint weighs the same; `exponential`: each older one weighs `decay` times the next."""
    decay: float = Field(0.5, gt=0, lt=1)
    """For `exponential`: the weight of a checkpoint relative to the next newer one (`uniform` ignores it)."""


class AverageSettings(TrainedModel):
    """What the stage computes from: the model it averages (its shape, seed and stream, as every kind with checkpoints
    has) and its own section. The fingerprint hashes these; the run function reads them."""

    average: AverageConfig


def weights(config: AverageConfig, count: int) -> list[float]:
    """The weight of each of `count` checkpoints, oldest first; they sum to 1."""
    raw = [1.0] * count if config.method == "uniform" else [config.decay ** (count - 1 - i) for i in range(count)]
    return [w / sum(raw) for w in raw]


def run(ctx: StageContext) -> dict[str, Any]:
    """Average the last `last` checkpoints of the training stage this stage reads; save the result as one checkpoint."""
    import torch

    config: AverageConfig = ctx.settings.average
    stage = next(name for name in STARTS_FROM if name in ctx.request.spec.upstream)
    kept = checkpoints_of(ctx, stage, last=config.last)  # those alone, not every kept checkpoint
    if len(kept) < config.last:
        raise ConfigError(f"average.last is {config.last}, but {stage} kept {len(kept)} checkpoints: lower average.last or "
                          f"raise {stage}.keep_last")
    chosen = kept[-config.last:]
    shares = weights(config, len(chosen))
    total: dict[str, torch.Tensor] = {}
    for checkpoint, share in zip(chosen, shares, strict=True):
        model = load_weights(checkpoint)
        for name, tensor in model.items():
            total[name] = total.get(name, torch.zeros_like(tensor, dtype=torch.float64)) + share * tensor.double()
    averaged = {name: tensor.to(model[name].dtype) for name, tensor in total.items()}
    newest = chosen[-1]
    ctx.log.info("averaged %s checkpoints at steps %s (%s)", stage, ", ".join(str(c.step) for c in chosen), config.method)
    save_final(ctx, averaged, step=newest.step, tokens_seen=int(newest.metrics.get("tokens_seen", 0)))
    return {"stage": stage, "steps": [c.step for c in chosen], "weights": [round(w, 6) for w in shares], "checkpoints": 1}


def _settings(experiment: Experiment) -> AverageSettings:
    """The average's recipe, and the model it averages (what evaluating its checkpoint reads)."""
    return AverageSettings(**TrainedModel.fields_of(experiment), average=experiment.average)


AVERAGE = StageKind(
    name="average",
    description="The average of the last kept checkpoints of the last training stage: one checkpoint, evaluated like the "
                "others.",
    run=run,
    reads=("blend", "tokenizer", "pretrain", "sft", "rl"),
    section="average",
    config=AverageConfig,
    checkpoints=True,
    settings=AverageSettings,
    fingerprint=_settings,
    present=lambda experiment: experiment.average is not None and experiment.pretrain is not None,
    artifact=frozenset({"torch"}),
    imports=("factory.models.build", "factory.stages.training", "factory.train.checkpoint", "factory.train.records"),
)
