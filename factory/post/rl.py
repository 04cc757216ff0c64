"""The GRPO loop: actors sample and score groups of completions, learners update the policy, weights flow back.

One torch.distributed world holds `learners` + `actors` ranks (`factory.post.weightsync.Roles`).
Step s: the tasks of the step are drawn by seed; each actor samples its share of groups with the
weights it holds and scores them in the sandbox; every learner receives all rollouts and trains
on its share (DistributedDataParallel among the learners); every `sync_every` updates the
learners push their weights to the actors, which then lag by at most `sync_every - 1` versions.
Collectives block, so an actor samples step s + 1 while the learners update on step s whenever
no push falls between them. With no actors, the learners sample their own share with a copy of
the weights that, like an actor's, changes only at a push.

Every completion is drawn from a generator seeded by (seed, step, task, member), so the rollouts
do not depend on how many actors share the work, or on whether there are any. The policy runs
without dropout: the ratio to the sampling policy is exactly 1 where the weights are the same. Checkpoints fall on push steps: a resumed run
starts with actors holding exactly the learner's weights, as an uninterrupted one would.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from tokenizers import Tokenizer
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from factory.config.schema import ModelConfig, RLConfig
from factory.errors import ConfigError, StageFailed
from factory.models.build import build_model, count_parameters
from factory.models.generate import generate
from factory.models.sampling import Sampling
from factory.post.format import prompt
from factory.post.grpo import entropy, group_advantages, grpo_loss, token_logprobs
from factory.post.rewards import rewards
from factory.post.sandbox import Limits, Sandbox
from factory.post.weightsync import Roles, SyncStats, WeightSync
from factory.registry.layout import METRICS_FILE
from factory.train.checkpoint import CheckpointDir, CheckpointSink, RetentionPolicy
from factory.train.pretrain import build_optimizer, truncate_log
from factory.train.records import CHECKPOINT_DIR

MetricSink = Callable[[int, dict[str, float]], None]
CPU = torch.device("cpu")


@dataclass(frozen=True, kw_only=True, slots=True)
class Group:
    """G completions of one task, sampled by one weight version."""

    task: int
    """Index of the task in the train split."""
    sequences: torch.Tensor
    """(G, prompt + new) token ids: the prompt, then what was sampled (end-of-text after a completion's end)."""
    prompt_tokens: int
    mask: torch.Tensor
    """(G, new) 1 for the completion's tokens (its line-ending token included), 0 after."""
    old_logp: torch.Tensor
    """(G, new) log-probabilities of the sampled tokens under the weights that sampled them."""
    rewards: torch.Tensor
    passed: torch.Tensor
    formatted: torch.Tensor
    version: int
    """The learner update the sampling weights came from."""
    seconds: float = 0.0
    """What sampling and scoring the batch this group came in took its sampler."""


@dataclass(kw_only=True, slots=True)
class RLResult:
    steps: int
    resumed_from: int
    checkpoints: tuple[str, ...]
    parameters: int
    seconds: float
    last: dict[str, float] = field(default_factory=dict)
    """The metrics of the last logged step."""


def stop_tokens(tokenizer: Tokenizer, eos_id: int) -> torch.Tensor:
    """Ids whose text holds a newline, and end-of-text: a completion ends at the first of them."""
    ids = [i for i in range(tokenizer.get_vocab_size()) if "\n" in tokenizer.decode([i])]
    return torch.tensor(sorted({*ids, eos_id}), dtype=torch.int64)


def seeds_of(seed: int, step: int, task: int, group_size: int) -> list[int]:
    """One generator seed per completion, from what it is and not from who samples it."""
    return [int.from_bytes(hashlib.sha256(f"rl:{seed}:{step}:{task}:{g}".encode()).digest()[:8], "little") for g in range(group_size)]


def tasks_of_step(count: int, seed: int, step: int, per_step: int) -> list[int]:
    """The train tasks step `step` samples, by seed."""
    return random.Random(f"rl-tasks:{seed}:{step}").sample(range(count), min(per_step, count))


def sample_group(
    model: nn.Module, prompt_ids: list[int], seeds: Sequence[int], config: RLConfig, stops: torch.Tensor, eos_id: int, context: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample one completion per seed, the prompt cut to the model's `context`: returns sequences (G, P + new), mask (G, new),
    log-probs (G, new). A completion ends at its first stop token; end-of-text fills the slots after it (mask and log-prob 0)."""
    head = prompt_ids[-(context - config.max_new_tokens):]
    sampling = Sampling(new_tokens=config.max_new_tokens, temperature=config.temperature, eos_id=eos_id,
                        stop_ids=frozenset(stops.tolist()))
    done = generate(model, [head] * len(seeds), sampling, context=context, seeds=seeds, batch_size=len(seeds))
    width = max(len(c.tokens) for c in done)
    new = torch.full((len(seeds), width), eos_id, dtype=torch.int64)
    mask, logps = torch.zeros(len(seeds), width), torch.zeros(len(seeds), width)
    for row, completion in enumerate(done):
        n = len(completion.tokens)
        new[row, :n] = torch.tensor(completion.tokens, dtype=torch.int64)
        mask[row, :n] = 1.0
        logps[row, :n] = torch.tensor(completion.logprobs)
    sequences = torch.cat([torch.tensor([head] * len(seeds), dtype=torch.int64), new], dim=1)
    return sequences, mask, logps


def rollout(
    model: nn.Module, task_rows: list[dict], tasks: Sequence[int], step: int, version: int, seed: int, config: RLConfig,
    tokenizer: Tokenizer, stops: torch.Tensor, eos_id: int, sandbox: Sandbox, context: int,
) -> list[Group]:
    """Sample and score the groups of `tasks`."""
    started = time.perf_counter()
    sampled = []
    for task in tasks:
        row = task_rows[task]
        ids = tokenizer.encode(prompt(row["function"], row["call"])).ids
        sequences, mask, logp = sample_group(model, ids, seeds_of(seed, step, task, config.group_size), config, stops, eos_id, context)
        sampled.append((task, sequences, mask, logp))
    texts = [
        tokenizer.decode(seq[-mask.size(1):][: int(m.sum())].tolist())
        for _, sequences, mask, _ in sampled for seq, m in zip(sequences, mask, strict=True)
    ]
    scored = rewards([task_rows[t] for t, *_ in sampled for _ in range(config.group_size)], texts, sandbox, config.format_reward)
    groups = []
    for i, (task, sequences, mask, logp) in enumerate(sampled):
        mine = scored[i * config.group_size : (i + 1) * config.group_size]
        groups.append(Group(
            task=task, sequences=sequences, prompt_tokens=sequences.size(1) - mask.size(1), mask=mask, old_logp=logp,
            rewards=torch.tensor([r.value for r in mine]), passed=torch.tensor([float(r.passed) for r in mine]),
            formatted=torch.tensor([float(r.formatted) for r in mine]), version=version,
        ))
    seconds = time.perf_counter() - started
    return [dataclasses.replace(g, seconds=seconds) for g in groups]


def completion_logits(network: torch.nn.Module, group: Group) -> torch.Tensor:
    """Logits at the positions that predict each completion token: (G, new, vocab)."""
    logits = network(group.sequences[:, :-1])
    return logits[:, group.prompt_tokens - 1 :]


def train_rl(
    task_rows: list[dict], tokenizer: Tokenizer, eos_id: int, init: dict[str, torch.Tensor], model_config: ModelConfig,
    config: RLConfig, seed: int, roles: Roles, work_dir: Path, log: logging.Logger, on_metrics: MetricSink | None = None,
    on_checkpoint: CheckpointSink | None = None, device: torch.device = CPU,
) -> RLResult:
    """Run (or resume) GRPO from `init` on `device` (this rank's: learners train and actors sample there); checkpoints and
    metrics go to `work_dir` (learner 0 writes them and tells `on_checkpoint` of each checkpoint saved and deleted)."""
    vocab = tokenizer.get_vocab_size()
    model = build_model(model_config, vocab, seed)
    model.load_state_dict(init)
    model.to(device)
    reference = copy.deepcopy(model).eval() if roles.is_learner and config.kl > 0 else None
    torch.manual_seed(seed + roles.rank)
    sync = WeightSync(roles, list(model.named_parameters()))
    main = roles.rank == 0
    optimizer = build_optimizer(model, config)
    checkpoints = CheckpointDir(work_dir / CHECKPOINT_DIR, RetentionPolicy(keep_last=config.keep_last, best_metric=None), log,
                                on_event=on_checkpoint if main else None)
    if main:
        work_dir.mkdir(parents=True, exist_ok=True)
        checkpoints.drop_incomplete()
    start = 0
    found = checkpoints.latest() if roles.is_learner else None
    if found is not None:
        saved, state = found
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
        log.info("resuming RL from %s at step %d of %d", saved.name, start, config.steps)
    if roles.size > 1:
        start = _shared(roles, start)
    if main:
        truncate_log(work_dir / METRICS_FILE, start, inclusive=True)
    network = model
    if roles.is_learner and roles.learners > 1:
        network = DistributedDataParallel(model, process_group=sync.learner_group,
                                          device_ids=[device.index] if device.type == "cuda" else None)
    stops = stop_tokens(tokenizer, eos_id)
    limits = Limits(cpu_s=max(1, int(config.sandbox_seconds)), wall_s=config.sandbox_seconds, memory_mb=128)
    sandbox = Sandbox(limits, workers=2) if roles.is_actor or not roles.actors else None
    # Whoever samples holds a copy of the weights that changes only at a push: an actor's own model, or, when the
    # learners sample, a copy beside the policy. The rollouts (and the result) then do not depend on placement.
    sampler_model = copy.deepcopy(model) if not roles.actors else model
    held = push(sync, model, sampler_model, start)  # actors start from the learners' weights (fresh or resumed)
    version, sync_seconds = held.version, held.seconds
    started = time.perf_counter()
    last: dict[str, float] = {}
    window: list[dict[str, float]] = []
    for step in range(start, config.steps):
        step_started = time.perf_counter()
        tasks = tasks_of_step(len(task_rows), seed, step, config.prompts_per_step)
        samplers = roles.actors or roles.learners
        sampler = roles.rank - roles.learners if roles.actors else roles.rank
        share = len(tasks) // samplers
        groups: list[Group] = []
        if roles.is_actor or not roles.actors:
            groups = rollout(sampler_model, task_rows, tasks[sampler * share : (sampler + 1) * share], step, version, seed, config,
                             tokenizer, stops, eos_id, sandbox, model_config.context)
        if roles.size > 1:
            everyone = [None] * roles.size
            dist.all_gather_object(everyone, groups if (roles.is_actor or not roles.actors) else None)
            groups = [g for part in everyone if part for g in part]
        if roles.is_learner:
            per_learner = len(groups) // roles.learners
            mine = [_on(group, device) for group in groups[roles.rank * per_learner : (roles.rank + 1) * per_learner]]
            try:
                stats = _update(network, model, reference, optimizer, mine, config, step, roles, sync)
            except torch.OutOfMemoryError as e:
                raise StageFailed(f"out of GPU memory in the RL update of step {step + 1}: lower rl.group_size, rl.prompts_per_step "
                                  "or rl.max_new_tokens") from e
            row = _metrics(groups, stats, step - min(g.version for g in groups), sync_seconds, time.perf_counter() - step_started)
            window.append(row)
        done = step + 1
        if done % config.sync_every == 0 or done == config.steps:
            held = push(sync, model, sampler_model, done)
            version, sync_seconds = held.version, held.seconds
        if main and (done % config.log_every == 0 or done == config.steps):
            last = {"step": done, **{key: round(sum(r[key] for r in window) / len(window), 6) for key in window[0]}}
            window = []
            with open(work_dir / METRICS_FILE, "a") as f:
                f.write(json.dumps(last) + "\n")
            log.info("rl step %d/%d reward %.3f pass %.3f kl %.4f", done, config.steps, last["reward_mean"], last["pass_rate"], last["kl"])
            if on_metrics is not None:
                on_metrics(done, last)
        if main and (done == config.steps or (config.checkpoint_every and done % config.checkpoint_every == 0)):
            checkpoints.save(done, {"step": done, "model": model.state_dict(), "optimizer": optimizer.state_dict()},
                             {"reward": last.get("reward_mean", float("nan")), "loss": last.get("loss", float("nan")), "lr": config.lr})
    checkpoints.wait()
    return RLResult(
        steps=config.steps, resumed_from=start, checkpoints=tuple(c.name for c in checkpoints.complete()) if main else (),
        parameters=count_parameters(model), seconds=time.perf_counter() - started, last=last,
    )


def _on(group: Group, device: torch.device) -> Group:
    """`group` with the tensors the update reads on `device` (groups travel between ranks on the host)."""
    if device.type == "cpu":
        return group
    return dataclasses.replace(group, sequences=group.sequences.to(device), mask=group.mask.to(device),
                               old_logp=group.old_logp.to(device), rewards=group.rewards.to(device))


def push(sync: WeightSync, model: nn.Module, sampler_model: nn.Module, version: int) -> SyncStats:
    """Hand the learners' weights to whoever samples: the actors over torch.distributed, or the learners' sampling copy."""
    if sync.roles.actors:
        return sync.push(model, version)
    started = time.perf_counter()
    if sampler_model is not model:
        sampler_model.load_state_dict(model.state_dict())
    return SyncStats(seconds=time.perf_counter() - started, bytes=0, version=version)


def _shared(roles: Roles, start: int) -> int:
    """Rank 0's resume step on every rank (only learner 0's file system view decides)."""
    holder = [start]
    dist.broadcast_object_list(holder, src=0)
    return int(holder[0])


def _update(
    network: torch.nn.Module, model: nn.Module, reference: nn.Module | None, optimizer: torch.optim.Optimizer, groups: list[Group],
    config: RLConfig, step: int, roles: Roles, sync: WeightSync,
) -> dict[str, float]:
    """`updates_per_batch` optimizer steps on this learner's groups; the mean statistics of the first."""
    lr = config.lr * min(1.0, (step + 1) / config.warmup_steps) if config.warmup_steps else config.lr
    for group in optimizer.param_groups:
        group["lr"] = lr
    advantages = [group_advantages(g.rewards.view(1, -1)).view(-1) for g in groups]
    refs = []
    with torch.no_grad():
        for g in groups:
            if reference is None:
                refs.append(None)
                continue
            refs.append(token_logprobs(completion_logits(reference, g), g.sequences[:, g.prompt_tokens :], config.temperature))
    first: dict[str, float] = {}
    network.eval()  # no dropout: the ratio to the sampling policy must be 1 where the weights are the same
    for update in range(config.updates_per_batch):
        optimizer.zero_grad(set_to_none=True)
        sums = {"kl": 0.0, "clipped": 0.0, "ratio": 0.0, "entropy": 0.0, "loss": 0.0}
        for i, (g, a, ref) in enumerate(zip(groups, advantages, refs, strict=True)):
            last = i == len(groups) - 1
            context = network.no_sync() if isinstance(network, DistributedDataParallel) and not last else contextlib.nullcontext()
            with context:
                logits = completion_logits(network, g)
                targets = g.sequences[:, g.prompt_tokens :]
                logp = token_logprobs(logits, targets, config.temperature)
                parts = grpo_loss(logp, g.old_logp, logp.detach() if ref is None else ref, a, g.mask, config.clip, config.kl)
                (parts.loss / len(groups)).backward()
            with torch.no_grad():
                tokens = g.mask.sum().clamp(min=1)
                sums["entropy"] += float((entropy(logits.detach(), config.temperature) * g.mask).sum() / tokens)
            sums["kl"] += parts.kl
            sums["clipped"] += parts.clipped
            sums["ratio"] += parts.ratio
            sums["loss"] += parts.loss.item()
        if not groups:
            raise ConfigError("a learner got no groups: prompts_per_step must be at least the number of learners")
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip if config.grad_clip > 0 else float("inf"))
        if not torch.isfinite(norm):
            raise StageFailed(f"the RL gradient became {float(norm)} at step {step + 1}: lower rl.lr or raise rl.kl")
        optimizer.step()
        if update == 0:
            first = {key: value / len(groups) for key, value in sums.items()}
            first["grad_norm"] = float(norm)
    if roles.learners > 1:
        keys = sorted(first)
        tensor = torch.tensor([first[k] for k in keys], dtype=torch.float64, device=next(model.parameters()).device)  # nccl: on the GPU
        dist.all_reduce(tensor, group=sync.learner_group)
        first = {k: float(v) / roles.learners for k, v in zip(keys, tensor.tolist(), strict=True)}
    return {**first, "lr": lr}


def _metrics(groups: list[Group], stats: dict[str, float], lag: int, sync_seconds: float, step_seconds: float) -> dict[str, float]:
    """One step's RL metrics over every group of the step."""
    rewards_ = torch.cat([g.rewards for g in groups])
    return {
        "reward_mean": float(rewards_.mean()),
        "reward_std": float(rewards_.std(unbiased=False)),
        "pass_rate": float(torch.cat([g.passed for g in groups]).mean()),
        "format_rate": float(torch.cat([g.formatted for g in groups]).mean()),
        "response_tokens": float(torch.cat([g.mask.sum(dim=1) for g in groups]).mean()),
        "kl": stats["kl"], "entropy": stats["entropy"], "clip_fraction": stats["clipped"], "ratio": stats["ratio"],
        "loss": stats["loss"], "grad_norm": stats["grad_norm"], "lr": stats["lr"],
        "lag_versions": float(lag), "sync_seconds": sync_seconds, "rollout_seconds": max(g.seconds for g in groups), "step_seconds": step_seconds,
    }
