"""Runner support of the training kinds (pretrain, sft, rl): the tracked training loop, and what a training artifact holds.

Imported by their run functions only (it loads torch): reading the stage registry never imports it. A training stage
trains in its work directory (it outlives a killed process); rank 0 then links the kept checkpoints and logs into the
artifact and writes `run.json`, which names the final checkpoint the stages downstream start from.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from factory.config.control import ControlConfig
from factory.config.kinds import stage_kind, stage_kinds
from factory.config.plugins import resolve
from factory.config.stages import BASE, FROM_HF
from factory.config.schema import ModelConfig, PretrainConfig
from factory.data.catalog import open_catalog
from factory.data.loader import Batch, LoaderState
from factory.errors import StageFailed
from factory.models.hf_import import import_weights, planned_checkpoint
from factory.models.tokenizer import end_of_text, load_tokenizer
from factory.registry.layout import CHAT_TEMPLATE_FILE, MODEL_WEIGHTS, RUN_FILE
from factory.runtime.context import StageContext
from factory.runtime.progress import training_progress, wants_progress
from factory.stages.trainer import FILTERED, TrainingInputs
from factory.track.base import NullRun, TrackerRun, TrackingConfig, open_run
from factory.devices import describe
from factory.train.distributed import World
from factory.train.objective import NEXT_TOKEN, Objective, next_token_loss
from factory.train.pretrain import (
    CHECKPOINT_DIR, CONTROL_FILE, METRICS_FILE, POSITIONS_FILE, TrainResult, last_logged_step, last_row, load_weights, pretrain,
)

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from tokenizers import Tokenizer


ACTIVATION_FIGURES = ("activations_mb", "activations_saved_mb")
"""What one micro-batch's forward keeps for the backward, and what recomputation saves: from the metrics log into the summary."""
DEVICE_FIGURES = ("mfu", "tokens_per_second_per_gpu")
"""The last metrics row's utilisation on GPUs (`factory.train.utilisation`), in the stage summary."""


def run_training_kind(ctx: StageContext) -> dict[str, Any]:
    """The run function of every training kind (`factory.stages.trainer.training_kind`): train from the model it starts
    from (or the seed's), on the batches its source gives, minimising its loss; a relaunch resumes it."""
    kind = stage_kind(ctx.request.spec.kind)
    assert kind.training is not None and kind.section is not None, "training_kind declares both"
    model_config, tokenizer, eos_id, catalog = post_training_inputs(ctx)
    section = getattr(ctx.settings, kind.section)
    start = starts_from(ctx, *reversed([k.name for k in stage_kinds() if k.checkpoints and k.name in ctx.request.spec.upstream]))
    if start == FROM_HF and ctx.settings.model.from_hf is None and not kind.training.starts_from_model:
        start = ""  # a fresh model, initialised from the seed
    inputs = TrainingInputs(ctx=ctx, start=start, settings=ctx.settings, section=section, model=model_config, tokenizer=tokenizer, eos_id=eos_id,
                            world=ctx.world, log=ctx.log, rows=lambda dataset, columns: dataset_rows(ctx, catalog, dataset, columns))
    source = resolve(kind.training.batches)(inputs)
    declared, frozen = kind.training.loss, kind.training.frozen
    if declared is None:
        objective = Objective(name=kind.name, loss=next_token_loss, frozen=frozen) if frozen else NEXT_TOKEN
    else:
        plugin_loss = resolve(declared)  # its section is its last argument
        objective = Objective(name=kind.name, loss=lambda model, x, y, models: plugin_loss(model, x, y, models, section), frozen=frozen)
    summary = train_stage(ctx, kind.section, model_config, section, tokenizer.get_vocab_size(), source,
                          control=getattr(ctx.settings, "control", None), validation=inputs.validation,
                          init=final_weights(ctx, start) if start else None, objective=objective)
    if not summary:
        return summary
    if start:  # the chat template of the model it starts from stays with the model it becomes
        carry_chat_template(ctx, start)
    return {**summary, **({"started_from": start} if kind.training.starts_from_model else {}), **inputs.summary}


def dataset_rows(ctx: StageContext, catalog: Catalog, dataset: str, columns: tuple[str, ...]) -> list[dict[str, Any]]:
    """The rows of `dataset` at the version the upstream `filtered_datasets` stage wrote, with `columns`, in its order."""
    from factory.data.tables import parse_ref, resolve
    from factory.stages.versions import dataset_version

    ref = dataset_version(ctx, FILTERED, dataset)
    table, tag = parse_ref(ref)
    rows = catalog.load_table(table).scan(snapshot_id=resolve(catalog, table, tag), selected_fields=columns).to_arrow().to_pylist()
    if not rows:
        raise StageFailed(f"{ref} has no rows: the filters of dataset {dataset!r} removed them all")
    ctx.log.info("read %d rows of %s", len(rows), ref)
    return rows


def train_stage(
    ctx: StageContext,
    label: str,
    model_config: ModelConfig,
    config: PretrainConfig,
    vocab_size: int,
    data: Callable[[LoaderState | None], Iterator[Batch]],
    control: ControlConfig | None = None,
    validation: list[Batch] | tuple[()] = (),
    init: dict[str, torch.Tensor] | None = None,
    objective: Objective = NEXT_TOKEN,
) -> dict[str, Any]:
    """Run the training loop of a stage (pretraining or fine-tuning), tracked, then stage its checkpoints and logs.

    Training writes into the stage's work directory (it outlives a killed process); rank 0 then
    links the kept checkpoints and logs into the artifact.
    """
    world = ctx.world
    work = ctx.registry.work(ctx.request.spec.fingerprint)
    with tracked_run(ctx, world, work) as (tracker, report):

        def acted(record: dict[str, Any]) -> None:
            tags = {"control.last_action": describe_action(record)}
            if "alert" in record:
                tags[f"alert.{record['rule']}"] = f"step {record['step']}: {record['alert']}"
            tracker.set_tags(tags)

        with training_progress(label, config.steps, world.is_main and wants_progress(world.size)) as on_step:
            result = pretrain(
                data, vocab_size, model_config, config, ctx.settings.seed, work, ctx.log, report, world,
                control=control, validation=validation, on_control=acted, on_step=on_step, init=init,
                on_checkpoint=ctx.checkpoint, objective=objective, section=label,
            )
    if not world.is_main:
        return {}
    publish_checkpoints(ctx, work, result.checkpoints)
    write_run(ctx, model_config, vocab_size, steps=result.steps, tokens_seen=result.tokens_seen, parameters=result.parameters,
              checkpoints=result.checkpoints)
    return {
        "steps": result.steps,
        "final_loss": round(result.final_loss, 4),
        "tokens_seen": result.tokens_seen,
        "parameters": result.parameters,
        "checkpoints": len(result.checkpoints),
        "resumed_from_step": result.resumed_from,
        "ranks": world.size,
        "device": describe(world.device),
        "tracker_run": tracker.id,
        "tracker_url": tracker.url,
        "train_seconds": round(result.seconds, 2),
        "tokens_per_second": round((result.tokens_seen / result.steps) * (result.steps - result.resumed_from) / max(result.seconds, 1e-9)),
        **{key: value for key, value in last_row(work / METRICS_FILE).items() if key in ACTIVATION_FIGURES or key in DEVICE_FIGURES},
        **control_summary(work / CONTROL_FILE, result, config.steps),
    }


@contextlib.contextmanager
def tracked_run(ctx: StageContext, world: World, work: Path) -> Iterator[tuple[TrackerRun, Callable[[int, dict[str, float]], None]]]:
    """The tracker run of a training stage (rank 0; a null run elsewhere) and the sink its metrics go to; the run is
    finished as failed when the block raises."""
    tracker = open_tracker(ctx) if world.is_main else NullRun()
    # A relaunched stage trains again the steps after its last checkpoint; their metrics are the same bytes (resume is
    # bitwise), and the tracker already has them: Neptune refuses steps that do not increase.
    tracked_until = last_logged_step(work / METRICS_FILE)

    def report(step: int, row: dict[str, float]) -> None:
        ctx.reporter.metrics(step, row)
        if step > tracked_until:
            tracker.log_metrics(step, {key: value for key, value in row.items() if key != "step"})

    try:
        yield tracker, report
    except BaseException:
        tracker.finish("failed")
        raise
    tracker.finish("finished")


def publish_checkpoints(ctx: StageContext, work: Path, checkpoints: tuple[str, ...]) -> None:
    """Link the kept checkpoints and copy the logs of the work directory into the artifact."""
    for name in checkpoints:
        source = work / CHECKPOINT_DIR / name
        if source.is_dir():  # sharded
            shutil.copytree(source, ctx.out / name, copy_function=os.link)
        else:
            os.link(source, ctx.out / name)
        os.link(source.with_suffix(".json"), (ctx.out / name).with_suffix(".json"))
    for name in (METRICS_FILE, POSITIONS_FILE, CONTROL_FILE):
        if (work / name).exists():
            shutil.copyfile(work / name, ctx.out / name)


def write_run(
    ctx: StageContext, model_config: ModelConfig, vocab_size: int, *, steps: int, tokens_seen: int, parameters: int, checkpoints: tuple[str, ...]
) -> None:
    """`run.json`: what a training artifact holds and which checkpoint is its final one (the model stage exports it)."""
    run = {
        "model": model_config.model_dump(mode="json"),
        "vocab_size": vocab_size,
        "steps": steps,
        "tokens_seen": tokens_seen,
        "parameters": parameters,
        "checkpoints": list(checkpoints),
        "final": checkpoints[-1],
    }
    (ctx.out / RUN_FILE).write_text(json.dumps(run, indent=2, sort_keys=True))


def final_weights(ctx: StageContext, stage: str) -> dict[str, torch.Tensor]:
    """The final weights of an upstream training stage, of the model made elsewhere it starts from (`base`), or of the
    Hugging Face checkpoint `model.from_hf` names (`from_hf`)."""
    if stage == FROM_HF:
        if ctx.settings.model.from_hf is None:
            raise StageFailed(f"{ctx.request.spec.kind} starts from no model: none of its inputs is one, and model.from_hf is unset")
        return import_weights(ctx.settings.model.from_hf)
    if stage == BASE:
        return load_weights(ctx.upstream_file(BASE, MODEL_WEIGHTS))
    run = json.loads(ctx.upstream_file(stage, RUN_FILE).read_text())  # and the final checkpoint alone, not every kept one
    return load_weights(ctx.upstream_file(stage, run["final"]))


def starts_from(ctx: StageContext, *stages: str) -> str:
    """The input a post-training stage starts from: the model made elsewhere its `from` names, else the first of `stages`
    this experiment runs (`sft`, then `pretrain`, for rl), else `from_hf`: the checkpoint `model.from_hf` names."""
    upstream = ctx.request.spec.upstream
    return next((name for name in (BASE, *stages) if name in upstream), FROM_HF)


def starting_template(ctx: StageContext, start: str) -> tuple[str, str] | None:
    """The chat template of the model a post-training stage starts from, and where it was read: the checkpoint's
    (`from_hf`; one the factory cannot render is left out, with a warning), or the one the stage or model it starts from
    keeps (`chat_template.jinja`). None without one."""
    if start == FROM_HF:
        checkpoint = planned_checkpoint(ctx.settings.model.from_hf)
        if checkpoint.chat_template is None:
            return None
        if problem := checkpoint.chat_template_problem():  # a Hugging Face template may need what the sandbox does not give
            ctx.log.warning(f"the chat template of {checkpoint.chat_template_source} is left out: {problem}")
            return None
        return checkpoint.chat_template, checkpoint.chat_template_source
    template = ctx.upstream_file(start, CHAT_TEMPLATE_FILE)
    return (template.read_text(), f"the {start} input ({CHAT_TEMPLATE_FILE})") if template.is_file() else None


def carry_chat_template(ctx: StageContext, start: str) -> None:
    """Keep the chat template of the model the stage starts from (`starting_template`) next to this stage's checkpoints
    (the model stage exports the last training stage's), unless the stage wrote its own."""
    if (ctx.out / CHAT_TEMPLATE_FILE).exists():
        return
    if (carried := starting_template(ctx, start)) is not None:
        (ctx.out / CHAT_TEMPLATE_FILE).write_text(carried[0])


def describe_action(record: dict[str, Any]) -> str:
    """One line for what a control rule did."""
    said = "; ".join([*record.get("messages", []), *([f"ALERT {record['alert']}"] if "alert" in record else [])])
    return f"step {record['step']} {record['event']}: {record['rule']} -> {', '.join(record['operations'])}" + (f" ({said})" if said else "")


def control_summary(path: Path, result: TrainResult, planned_steps: int) -> dict[str, Any]:
    """What the control rules did, for the manifest and the materialization (nothing without a control section)."""
    if not path.exists():
        return {}
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    summary: dict[str, Any] = {"control_actions": len(records), "control_log": "\n".join(describe_action(r) for r in records[-50:])}
    if result.stopped_by:
        summary["stopped"] = f"stopped at step {result.steps} of {planned_steps} by {result.stopped_by}"
    if math.isfinite(result.eval_loss):
        summary["validation_loss"] = round(result.eval_loss, 4)
    return summary


def open_tracker(ctx: StageContext) -> TrackerRun:
    """The tracker run of this training stage (resumed when the stage is relaunched), with its config and provenance."""
    request = ctx.request
    tracker = open_run(
        TrackingConfig.from_env(os.environ), Path(request.registry).parent, name=request.provenance.experiment, run_key=request.spec.fingerprint
    )
    tracker.log_params(ctx.config)
    tracker.set_tags({
        "fingerprint": request.spec.fingerprint, "git_commit": request.provenance.git_commit, "code": request.spec.code,
        "experiment": request.provenance.experiment, "config_hash": request.provenance.config_hash,
    })
    ctx.log.info("tracking in %s", tracker.url)
    return tracker


def post_training_inputs(ctx: StageContext) -> tuple[ModelConfig, Tokenizer, int, Catalog]:
    """What both post-training stages read: the model's shape, the tokenizer and its end-of-text id, the catalog."""
    tokenizer_file = ctx.upstream_tokenizer()
    tokenizer = load_tokenizer(tokenizer_file)
    return ctx.settings.model, tokenizer, end_of_text(tokenizer, tokenizer_file), open_catalog(ctx.request.catalog)
