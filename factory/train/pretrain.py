"""The pretraining loop: seeded, AdamW with warmup + cosine, gradient clipping and accumulation, ranks, checkpoints.

A run lives in a work directory. Relaunched on the same directory, it resumes from the latest
complete checkpoint: model, optimizer, step, RNG state of every rank and the loader's position
are restored, so the final weights are the bytes an uninterrupted run would have written.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from factory.config.control import ControlConfig
from factory.config.schema import ModelConfig, PretrainConfig, RLConfig, SFTConfig
from factory.data.loader import Batch, LoaderState
from factory.errors import ConfigError, Interrupted, StageFailed
from factory.models.build import build_model, count_parameters
from factory.registry.layout import CONTROL_FILE, METRICS_FILE, POSITIONS_FILE
from factory.train.checkpoint import CheckpointDir, CheckpointSink, RetentionPolicy, load_checkpoint
from factory.train.control import Actions, Controller, Observation
from factory.train.distributed import SINGLE, World, gather
from factory.train.heap import keep_freed_memory
from factory.train.objective import NEXT_TOKEN, Minimised, Objective, frozen_models
from factory.train.parallel import build_for_training, check_split, wrap
from factory.train.records import CHECKPOINT_DIR
from factory.train.resume import resume
from factory.train.step import activation_memory, gradients, memory_mb, validation_loss
from factory.train.utilisation import Utilisation

MetricSink = Callable[[int, dict[str, float]], None]
StepSink = Callable[[int, float, float], None]
ControlSink = Callable[[dict[str, Any]], None]
"""Receives every record of an action a control rule took (rank 0 only)."""
BatchSource = Callable[[LoaderState | None], Iterator[Batch]]
"""Batches from a position on (None: from the start), this rank's slice of each global batch."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainResult:
    """What a finished run reports."""

    steps: int
    final_loss: float
    tokens_seen: int
    parameters: int
    checkpoints: tuple[str, ...]
    """Checkpoint files kept, oldest first; the last is the final one."""
    seconds: float
    resumed_from: int
    """The step training resumed at (0: a fresh start)."""
    steps_computed: int = 0
    """Forward/backward passes this process ran (skipped and rewound steps included)."""
    checkpoint_bytes: int = 0
    """Bytes of checkpoints this process wrote (deleted ones included)."""
    stopped_by: str | None = None
    """The control rule that stopped the run before `pretrain.steps` (None: it ran to the end)."""
    eval_loss: float = float("nan")
    """The last in-loop validation loss (nan: none was measured)."""


def lr_at(step: int, config: PretrainConfig) -> float:
    """Linear warmup to `lr`, then cosine decay to `lr * min_lr_ratio` at the last step."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps - 1)
    floor = config.lr * config.min_lr_ratio
    return floor + 0.5 * (config.lr - floor) * (1 + math.cos(math.pi * min(1.0, progress)))


def build_optimizer(model: nn.Module, config: PretrainConfig | RLConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms, biases); any training section with lr, betas, weight_decay.
    On GPUs the fused implementation (one kernel for every parameter's update); on the CPU torch's default, as always."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = all(p.device.type == "cuda" for p in model.parameters())
    return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, **({"fused": True} if fused else {}))


def precision_of(config: PretrainConfig, device: torch.device) -> torch.dtype | None:
    """The autocast dtype: bf16 when asked for (or `auto` on a GPU that has it), else None (fp32)."""
    if config.precision == "bf16":
        return torch.bfloat16
    if config.precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


def pretrain(
    data: BatchSource,
    vocab_size: int,
    model_config: ModelConfig,
    config: PretrainConfig,
    seed: int,
    work_dir: Path,
    log: logging.Logger,
    on_metrics: MetricSink | None = None,
    world: World = SINGLE,
    control: ControlConfig | None = None,
    validation: Sequence[Batch] = (),
    on_control: ControlSink | None = None,
    on_step: StepSink | None = None,
    init: Mapping[str, torch.Tensor] | None = None,
    on_checkpoint: CheckpointSink | None = None,
    objective: Objective = NEXT_TOKEN,
    section: str | None = None,
) -> TrainResult:
    """Train (or resume training) a model; checkpoints, metrics and data positions go to `work_dir`.

    `data_positions.jsonl` records the loader's position before every `log_every`-th step, so any
    batch can be fetched again later (`factory data batch`). Only rank 0 writes files and reports.
    With a `control` section, its rules run at every event (`validation`: the whole batches an
    in-loop evaluation scores) and every action they take is appended to `control.jsonl`.
    `on_step` hears of every step (steps done, loss, tokens/s): a progress bar. `init`: the weights
    a fresh run starts from (fine-tuning), instead of the seeded initialisation. `on_checkpoint` hears of every
    checkpoint saved and deleted (rank 0). `objective`: the loss it minimises and the frozen models that loss reads
    (`factory.train.objective`); `section`: the experiment section its knobs come from, as errors name it.
    """
    device = world.device
    section = section or ("sft" if isinstance(config, SFTConfig) else "pretrain")
    check_split(config, world, section)
    if control is not None and objective.loss is not NEXT_TOKEN.loss:
        raise ConfigError(f"control rules read the next-token loss, and {section} minimises {objective.name!r}: remove the control section")
    # Before the model: its buffers and every step's come from a heap that is no longer trimmed (FSDP's gathered blocks are
    # mapped and unmapped instead).
    keep_freed_memory(sharded=config.parallelism == "fsdp" and world.size > 1)
    model = build_for_training(model_config, vocab_size, seed, config, world, init)
    optimizer = build_optimizer(model, config)
    frozen = frozen_models(objective, lambda: build_model(model_config, vocab_size, seed), init, device)
    torch.manual_seed(seed + world.rank)  # dropout differs per rank, as their batches do
    policy = RetentionPolicy(keep_last=config.keep_last, best_metric=config.keep_best_by)
    checkpoints = CheckpointDir(
        work_dir / CHECKPOINT_DIR, policy, log, asynchronous=config.async_checkpoints, sharded=config.checkpoint_format == "sharded", world=world,
        on_event=on_checkpoint,
    )
    controller = Controller(control, config.steps) if control is not None else None
    if control is not None and not validation and (control.eval_every or controller.uses_evaluations):
        raise ConfigError("control evaluates the validation loss, but the blend gave no validation batches: raise data.validation_percent")
    start, position, tokens_seen = 0, LoaderState(), 0
    if world.is_main:
        work_dir.mkdir(parents=True, exist_ok=True)
        checkpoints.drop_incomplete()
    found = resume(checkpoints, model, optimizer, world, log)
    if found is not None:
        saved, state = found
        start, position, tokens_seen = state["step"], LoaderState.from_json(state["data_position"]), state["tokens_seen"]
        if len(state["rng"]) == world.size:
            torch.random.set_rng_state(state["rng"][world.rank]["torch"])
        else:  # resharded: the same global batches follow, but the ranks' random streams (dropout) cannot be split anew
            torch.manual_seed(seed + world.rank + 1_000_003 * start)
            log.warning("%s was written by %d rank(s), this run has %d: each rank's random stream is reseeded from the seed "
                        "and step (a bitwise resume needs the world size that wrote it)", saved.name, len(state["rng"]), world.size)
        if controller is not None:
            controller.load(state["control"])
        log.info("resuming from %s at step %d of %d", saved.name, start, config.steps)
    stopped = controller is not None and controller.stopped_by is not None
    end = start if stopped else config.steps
    if world.is_main:
        truncate_log(work_dir / METRICS_FILE, start, inclusive=True)
        truncate_log(work_dir / POSITIONS_FILE, start, inclusive=False)
        _keep_lines(work_dir / CONTROL_FILE, controller.records if controller else 0)
    autocast = precision_of(config, device)
    network = wrap(Minimised(model, objective, frozen), config, world)
    batches = data(position if start else None)
    started = time.perf_counter()
    interval_losses: list[float] = []
    logged_at, logged_tokens, logged_step = time.perf_counter(), tokens_seen, start
    loss_value = _last_logged_loss(work_dir / METRICS_FILE) if start == end else float("nan")
    steps_computed, eval_loss = 0, float("nan")
    grad_norm = float("nan")
    unread: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    """Steps whose loss and gradient norm are still on the device, unread."""
    utilisation = Utilisation.of(model, model_config, world, log)
    activations: dict[str, float] | None = None
    network.train()
    step = start
    with (
        _interruptible(lambda: step, config.steps, checkpoints),
        _appending(work_dir, world, controller is not None) as (metrics_file, positions_file, control_file),
    ):

        def record(actions: Actions | None, batch: Batch | None = None, samples: list[float] | None = None) -> None:
            if actions is not None and actions.records:
                _record(actions, batch, samples, world, log, control_file, on_control)

        def save(done: int, final: bool) -> None:
            state = _state(model, optimizer, done, position, tokens_seen, world, controller)
            if world.is_main or checkpoints.sharded:  # sharded: every rank writes its share
                mean = sum(interval_losses) / len(interval_losses) if interval_losses else loss_value
                checkpoints.save(done, state, {"loss": mean, "lr": lr, "tokens_seen": tokens_seen}, final=final)

        def evaluate(done: int) -> Actions:  # only with a controller: evaluations exist for its rules
            nonlocal eval_loss
            eval_loss = validation_loss(model, validation, autocast, device)
            log.info("step %d validation loss %.4f", done, eval_loss)
            return controller.observe(Observation(event="eval", step=done, eval_loss=eval_loss))

        if config.checkpoint_at_start and start == 0 < end:  # the starting weights, evaluated as step 0 (no loss yet)
            lr = lr_at(0, config)
            if world.is_main or checkpoints.sharded:
                checkpoints.save(0, _state(model, optimizer, 0, position, tokens_seen, world, controller), {"lr": lr, "tokens_seen": 0})
        while step < end:
            step_started = time.perf_counter()
            lr = lr_at(step, config) * (controller.lr_factor if controller else 1.0)
            for group in optimizer.param_groups:
                group["lr"] = lr
            if positions_file and step % config.log_every == 0:
                positions_file.write(json.dumps({"step": step, "state": position.to_json()}) + "\n")
                positions_file.flush()
            batch = next(batches, None)
            if batch is None:
                raise ConfigError(
                    f"the data ran out of documents after {step} of {config.steps} steps: give a blend part `mode: oversample`, "
                    f"add data, or lower {section}.steps"
                )
            if activations is None:  # measured once, on the first batch this process trains
                activations = activation_memory(model, batch, config, autocast, device, objective, frozen)
            want_samples = controller is not None and controller.wants_samples
            try:
                loss, norm, samples = gradients(network, optimizer, batch, config, world, autocast, device, want_samples)
            except (torch.OutOfMemoryError, MemoryError) as e:
                raise StageFailed(
                    f"out of memory at step {step + 1}; {_kept(checkpoints)}. Lower {section}.batch_size, raise grad_accum_steps "
                    "or shrink the model"
                ) from e
            position, tokens_seen, done = batch.state, tokens_seen + batch.global_tokens, step + 1
            steps_computed += 1
            logs = done % config.log_every == 0 or done == config.steps
            unread.append((done, loss, norm))
            # The numbers wait on the device until a rule (every step), a log row or a checkpoint needs them: one wait for all.
            if controller is not None or logs or (config.checkpoint_every and done % config.checkpoint_every == 0):
                read, unread = _read(unread), []
                _, loss_value, grad_norm = read[-1]
                if controller is None:  # no rule can drop an update: every step read so far was applied
                    if bad := next(((at, value) for at, value, _ in read if not math.isfinite(value)), None):
                        raise StageFailed(f"the training loss became {bad[1]} at step {bad[0]}; {_kept(checkpoints)}. Lower {section}.lr "
                                          "or raise grad_clip")
                    interval_losses += [value for _, value, _ in read]
            now = time.perf_counter()
            actions = controller.observe(Observation(
                event="step_end", step=done, loss=loss_value, grad_norm=grad_norm, lr=lr, sample_losses=tuple(samples),
                tokens_per_second=batch.global_tokens / max(now - step_started, 1e-9),
            )) if controller else None
            dropped = actions is not None and actions.drops_update
            if controller is not None and not math.isfinite(loss_value) and not dropped:
                raise StageFailed(f"the training loss became {loss_value} at step {done}; {_kept(checkpoints)}. Lower {section}.lr or raise grad_clip")
            if not dropped:
                optimizer.step()
                if controller is not None:
                    interval_losses.append(loss_value)
            record(actions, batch, samples)
            if on_step is not None:  # the loss last read: a bar does not make the GPU wait every step
                on_step(done, loss_value, batch.global_tokens / max(now - step_started, 1e-9))
            if logs:
                interval_speed = (tokens_seen - logged_tokens) / max(now - logged_at, 1e-9)
                row = {
                    "step": done, "loss": round(loss_value, 6), "lr": lr, "grad_norm": round(grad_norm, 6),
                    "tokens_per_second": round(interval_speed, 1),
                    "step_seconds": round((now - logged_at) / max(1, done - logged_step), 6),
                    **memory_mb(device),
                    **activations,
                    **utilisation.row(interval_speed),
                }
                logged_at, logged_tokens, logged_step = now, tokens_seen, done
                if metrics_file:
                    metrics_file.write(json.dumps(row) + "\n")
                    metrics_file.flush()
                    log.info("step %d/%d loss %.4f lr %.2e", done, config.steps, row["loss"], lr)
                    if on_metrics:
                        on_metrics(done, row)
            if actions is not None and actions.rewind:
                step = done = _rewind(model, optimizer, checkpoints, done, world, log)
                if not actions.stop:
                    continue
            step = done
            stop = actions is not None and actions.stop
            wants_checkpoint = done == config.steps or bool(config.checkpoint_every and done % config.checkpoint_every == 0)
            wants_checkpoint |= actions is not None and actions.checkpoint
            if controller is not None and ((control.eval_every and done % control.eval_every == 0) or (actions and actions.evaluate)):
                followed = evaluate(done)
                record(followed)
                if followed.rewind:  # with stop: end on the last good checkpoint's weights
                    step = done = _rewind(model, optimizer, checkpoints, done, world, log)
                    if not followed.stop:
                        continue
                stop |= followed.stop
                wants_checkpoint |= followed.checkpoint
            if wants_checkpoint or stop:
                save(done, final=stop or done == config.steps)
                interval_losses = []
                if controller is not None:
                    followed = controller.observe(Observation(event="checkpoint", step=done))
                    record(followed)
                    if followed.evaluate:
                        record(evaluate(done))
                    if followed.stop and not stop:  # the checkpoint just saved does not say the run stopped
                        stop = True
                        save(done, final=True)
            if stop:
                log.info("stopped at step %d of %d by control rule %s", done, config.steps, controller.stopped_by)
                end = done
        if controller is not None:
            finished = controller.observe(Observation(event="train_end", step=step))
            record(finished)
            if finished.evaluate and validation:
                record(evaluate(step))
    checkpoints.wait()
    kept = tuple(c.name for c in checkpoints.complete())
    return TrainResult(
        steps=end,
        final_loss=loss_value,
        tokens_seen=tokens_seen,
        parameters=count_parameters(model),
        checkpoints=kept,
        seconds=time.perf_counter() - started,
        resumed_from=start,
        steps_computed=steps_computed,
        checkpoint_bytes=checkpoints.bytes_written,
        stopped_by=controller.stopped_by if controller else None,
        eval_loss=eval_loss,
    )


def _read(unread: list[tuple[int, torch.Tensor, torch.Tensor]]) -> list[tuple[int, float, float]]:
    """Each unread step's loss and gradient norm as numbers: one copy to the host for all of them."""
    values = torch.stack([torch.stack([loss.double(), norm.double()]) for _, loss, norm in unread]).tolist()
    return [(step, loss, norm) for (step, _, _), (loss, norm) in zip(unread, values, strict=True)]


def _rewind(model: nn.Module, optimizer: torch.optim.Optimizer, checkpoints: CheckpointDir, done: int, world: World, log: logging.Logger) -> int:
    """Reload the latest good checkpoint's weights and optimizer; the data goes on from where it is. Returns the step to go on from."""
    checkpoints.wait()
    found = resume(checkpoints, model, optimizer, world, log)
    if found is None:
        log.warning("control asked to rewind at step %d, but no checkpoint was saved yet: the batch is skipped instead", done)
        return done
    saved, _ = found
    log.warning("rewound from step %d to %s; the data goes on past the batches in between", done, saved.name)
    return saved.step


def _record(
    actions: Actions, batch: Batch | None, samples: list[float] | None, world: World, log: logging.Logger, file: Any, sink: ControlSink | None
) -> None:
    """Write what the rules did: to the log (a Dagster event), control.jsonl and the sink (the tracker)."""
    wants_batch = batch is not None and any(record.get("batch") is True for record in actions.records)  # the same on every rank
    documents = [doc for part in gather(world, [list(d) for d in batch.documents]) for doc in part] if wants_batch else []
    for record in actions.records:
        if record.get("batch") is True:
            record["batch"] = {"documents": documents, "sample_losses": [round(v, 6) for v in samples or []]}
        if not world.is_main:
            continue
        said = "; ".join(record.get("messages", []))
        line = f"control: rule {record['rule']} at step {record['step']} ({record['event']}): {', '.join(record['operations'])}"
        (log.warning if "alert" in record else log.info)("%s%s%s", line, f" - {said}" if said else "",
                                                          f" - ALERT: {record['alert']}" if "alert" in record else "")
        file.write(json.dumps(record, sort_keys=True) + "\n")
        file.flush()
        if sink is not None:
            sink(record)


def _kept(checkpoints: CheckpointDir) -> str:
    """What a failed run leaves to resume from."""
    kept = checkpoints.complete()
    return f"the last good checkpoint ({kept[-1].name}) is kept" if kept else "no checkpoint was saved yet"


def _state(
    model: nn.Module, optimizer: torch.optim.Optimizer, step: int, position: LoaderState, tokens_seen: int, world: World, controller: Controller | None
) -> dict[str, Any]:
    """The full training state; every rank's RNG is gathered so each resumes its own."""
    rng = {"torch": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    return {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "data_position": position.to_json(),
        "tokens_seen": tokens_seen,
        "rng": gather(world, rng),
        **({"control": controller.state()} if controller is not None else {}),
    }


@contextlib.contextmanager
def _interruptible(steps_done: Callable[[], int], steps: int, checkpoints: CheckpointDir) -> Iterator[None]:
    """Ctrl-C or SIGTERM in the loop ends the stage saying where it stopped and which checkpoint a rerun resumes from."""
    try:
        yield
    except KeyboardInterrupt:
        kept = checkpoints.complete()
        resume = f"its last checkpoint is {kept[-1].name}" if kept else "it had saved no checkpoint yet"
        raise Interrupted(f"interrupted at step {steps_done()} of {steps}; {resume}") from None


@contextlib.contextmanager
def _appending(work_dir: Path, world: World, control: bool) -> Iterator[tuple[Any, Any, Any]]:
    """The metrics, positions and control logs, opened for appending on rank 0 (None elsewhere)."""
    if not world.is_main:
        yield None, None, None
        return
    with contextlib.ExitStack() as files:
        metrics, positions = files.enter_context(open(work_dir / METRICS_FILE, "a")), files.enter_context(open(work_dir / POSITIONS_FILE, "a"))
        yield metrics, positions, files.enter_context(open(work_dir / CONTROL_FILE, "a")) if control else None


def last_row(path: Path) -> dict[str, Any]:
    """The last row of a metrics log ({} when there is none)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return rows[-1] if rows else {}


def _last_logged_loss(path: Path) -> float:
    """The loss of the last row of the metrics log (a run resumed after its final checkpoint trains no step)."""
    return float(last_row(path).get("loss", float("nan")))


def last_logged_step(path: Path) -> int:
    """The step of the last row of a metrics log (0: none), before a relaunch truncates it."""
    return int(last_row(path).get("step", 0))


def truncate_log(path: Path, step: int, inclusive: bool) -> None:
    """Keep the rows of a JSONL log up to `step` (rows after it will be written again by the resumed run)."""
    if not path.exists():
        return
    last = step if inclusive else step - 1
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= last]
    path.write_text("".join(line + "\n" for line in kept))


def _keep_lines(path: Path, count: int) -> None:
    """Keep the first `count` lines of a log (the records a resumed controller already counts)."""
    if path.exists():
        path.write_text("".join(line + "\n" for line in path.read_text().splitlines()[:count]))


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """The model weights of a checkpoint (a file or a sharded directory) or exported model file."""
    state = load_checkpoint(path)
    return state["model"] if "model" in state else state
