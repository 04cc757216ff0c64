"""`factory plan`: for every experiment and stage, cached / run / waiting, and why a stage must run.

Stages whose upstream is not computed yet are planned with a placeholder digest derived from
the upstream fingerprint, so two variants that share a stage show it once. A training stage (a kind with
checkpoints) also shows where it runs: nodes x processes per node, on the CPU or how many GPUs per node (`cpu`, `cuda x8`),
and how its ranks share the model.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from factory.config import Experiment, StageSpec, plan_stage, upstream_of
from factory.config.fingerprint import code_parts
from factory.config.kinds import stage_kind
from factory.config.schema import PretrainConfig
from factory.config.sources import changed_files, source_files
from factory.config.base_refs import ALIAS_PREFIX
from factory.config.stages import BASE, PENDING, placement, stages_of
from factory.errors import ArtifactError
from factory.devices import where as where_it_runs
from factory.registry.index import Where
from factory.registry.layout import SOURCES_FILE
from factory.registry.lease import abandoned
from factory.registry.seam import Registry
from factory.registry.store import Manifest
from factory.ops.bases import Base, bound_with, resolve

FILES_KEY = "files"
"""The raw stage's config key that holds each source's file digest."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StagePlan:
    """What will happen to one stage of one experiment."""

    experiment: str
    kind: str
    status: str
    """cached | run | waiting | shared (computed once by another variant of this plan)"""
    fingerprint: str
    detail: str
    placement: dict[str, Any] = field(default_factory=dict)
    """A training stage's ranks (`nodes`, `processes`, stage-specific roles) and, when its section has them,
    `parallelism` and `activation_checkpointing` (left out at `none`); empty for other stages."""

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form."""
        return asdict(self)


def build_plan(experiments: Iterable[Experiment], registry: Registry) -> list[StagePlan]:
    """Plan every stage of every experiment against what the registry already holds. An experiment that starts from a
    model made elsewhere is planned from what its `from` names now (`factory.ops.bases`), unless it is bound already;
    the stage that starts from it says so."""
    plans: list[StagePlan] = []
    first_runner: dict[str, str] = {}
    # what an experiment's stage produced before, asked of the registry's index when a stage to run needs a reason
    history = functools.cache(lambda kind, name: list(registry.manifests(kind, Where(experiment=name))))
    for stage in planned_stages(experiments, registry):
        experiment, spec, base = stage.experiment, stage.spec, stage.base
        status, detail = _decide(experiment, spec, stage.manifest, registry, first_runner, history)
        if BASE in spec.upstream and base is not None:
            detail = f"{spec.kind} starts from {base.said}; {detail}"
        plans.append(StagePlan(experiment=experiment.name, kind=spec.kind, status=status, fingerprint=spec.fingerprint, detail=detail,
                               placement=training_placement(experiment, spec.kind)))
    return plans


@dataclass(frozen=True, kw_only=True, slots=True)
class PlannedStage:
    """One stage of an experiment as planned: its spec, and its artifact when the registry holds it already."""

    experiment: Experiment
    """Bound to the model its `from` names now, when it has one."""
    spec: StageSpec
    manifest: Manifest | None
    base: Base | None


def planned_stages(experiments: Iterable[Experiment], registry: Registry) -> Iterator[PlannedStage]:
    """Every stage of every experiment, in order, planned against the registry: a stage downstream of one not computed
    yet gets a placeholder digest for it (`PENDING` + its fingerprint)."""
    for experiment in experiments:
        base = resolve(experiment, registry) if experiment.base is not None and not experiment.bound else None
        experiment = bound_with(experiment, base)
        digests: dict[str, str] = dict(experiment.bound)
        for kind in stages_of(experiment):
            spec = plan_stage(experiment, kind, {name: digests[name] for name in upstream_of(experiment, kind)})
            manifest = registry.lookup(spec.fingerprint)
            digests[kind] = manifest.digest if manifest is not None else PENDING + spec.fingerprint
            yield PlannedStage(experiment=experiment, spec=spec, manifest=manifest, base=base)


def training_placement(experiment: Experiment, kind: str) -> dict[str, Any]:
    """Where a training stage runs and how its ranks share the model (see `StagePlan.placement`); {} for another stage."""
    declared = stage_kind(kind)
    if not declared.checkpoints:
        return {}
    where = placement(experiment, kind)
    shown: dict[str, Any] = {"nodes": where.nodes, "processes": where.processes, "device": where_it_runs(where.gpus), **where.roles}
    section = getattr(experiment, declared.section, None) if declared.section else None
    if isinstance(section, PretrainConfig):  # pretrain, sft, and a plugin's kind with a section of that type
        shown["parallelism"] = section.parallelism
        if section.activation_checkpointing != "none":
            shown["activation_checkpointing"] = section.activation_checkpointing
    return shown


def describe_placement(shown: Mapping[str, Any]) -> str:
    """`1 node × 2 processes, cuda x2, fsdp, activation checkpointing full` ('' for a stage without a training placement)."""
    if not shown:
        return ""
    nodes, processes = shown["nodes"], shown["processes"]
    parts = [f"{nodes} node{'s' * (nodes != 1)} × {processes} process{'es' * (processes != 1)}", shown.get("device", "cpu")]
    if "parallelism" in shown:
        parts.append(shown["parallelism"])
    if "activation_checkpointing" in shown:
        parts.append(f"activation checkpointing {shown['activation_checkpointing']}")
    said = {"nodes", "processes", "device", "parallelism", "activation_checkpointing"}
    return ", ".join([*parts, *(f"{key} {value}" for key, value in shown.items() if key not in said)])


def counts(plans: Iterable[StagePlan]) -> dict[str, int]:
    """How many times each stage kind will be computed."""
    totals: dict[str, int] = {}
    for plan in plans:
        if plan.status == "run":
            totals[plan.kind] = totals.get(plan.kind, 0) + 1
    return totals


def _decide(
    experiment: Experiment, spec: StageSpec, manifest: Manifest | None, registry: Registry, first_runner: dict[str, str],
    history: Callable[[str, str], list[Manifest]],
) -> tuple[str, str]:
    if manifest is not None:
        return "cached", f"from {manifest.experiment} (run {manifest.run_id or 'outside Dagster'}, {manifest.created})"
    note = ""
    if (holder := registry.holder(spec.fingerprint)) is not None:
        if (gone := abandoned(holder)) is None:
            return "waiting", f"{holder.owner} holds the lease"
        note = f" (lease of {holder.owner} ignored: {gone})"  # the next launch takes it over
    if spec.fingerprint in first_runner:
        return "shared", f"computed once, by {first_runner[spec.fingerprint]}"
    first_runner[spec.fingerprint] = experiment.name
    return "run", why_run(experiment.name, spec, history(spec.kind, experiment.name), registry,
                          experiment.base[1] if experiment.base else None) + note


def why_run(
    experiment: str, spec: StageSpec, history: Iterable[Manifest], registry: Registry | None = None, base_ref: str | None = None,
) -> str:
    """What changed since this experiment last produced this stage (or that it never did); for the raw stage, which
    source files were added, changed or removed (the `registry` holds the listing the last run read)."""
    previous = sorted((m for m in history if m.kind == spec.kind and m.experiment == experiment), key=lambda m: m.created)
    if not previous:
        return "never computed for this experiment"
    last = previous[-1]
    reasons = config_changes(last.config, spec.config)
    if stage_kind(spec.kind).reads_sources and registry is not None:
        reasons = [*source_changes(last, spec, registry), *(r for r in reasons if not r.startswith(FILES_KEY + "."))]
    for name, digest in spec.upstream.items():
        if last.inputs.get(name) != digest:
            reasons.append(base_moved(last, digest, base_ref) if name == BASE else
                           f"input {name} changed" + (" (not computed yet)" if digest.startswith(PENDING) else ""))
    if last.code != spec.code:
        reasons.append(code_changes(last.code, spec.code))
    return "; ".join(reasons) or "its last artifact is missing or damaged"


def code_changes(before: str, after: str) -> str:
    """Which code changed between two code identities: the factory's, a plugin package's (by distribution), or which plugin
    a stage runs now or no longer runs."""
    was, now = code_parts(before), code_parts(after)
    said = []
    for name in dict.fromkeys((*was, *now)):
        if name not in was:
            said.append(f"{name} added")
        elif name not in now:
            said.append(f"{name} removed")
        elif was[name] != now[name]:
            said.append(f"{name} changed ({was[name][:22]} -> {now[name][:22]})")
    return "code: " + ", ".join(said)


def base_moved(last: Manifest, digest: str, base_ref: str | None) -> str:
    """Why the model a stage starts from is another than last time: the alias it names moved, or it names another."""
    before, now = last.inputs.get(BASE, "(none)")[:12], digest.removeprefix(PENDING)[:12]
    written = last.base.get("from", "")
    if written and written == base_ref and written.startswith(ALIAS_PREFIX):
        return f"alias {written.removeprefix(ALIAS_PREFIX)} moved from {before} to {now}"
    if written and written == base_ref:
        return f"{written} is another model now: {before} -> {now}"
    return f"the base model changed from {before} to {now}" + (f" (from: {written} -> {base_ref})" if written else "")


def source_changes(last: Manifest, spec: StageSpec, registry: Registry) -> list[str]:
    """`source stdlib: 2 added (a.py, b.py)` for each dataset whose files differ from what the last raw stage read."""
    before = last.config.get(FILES_KEY, {})
    try:
        read = json.loads(registry.read(last, SOURCES_FILE) or b"{}")
    except ArtifactError:  # the last ingest's artifact is damaged: its listing is not there to compare with
        read = {}
    reasons = []
    for name, digest in spec.config[FILES_KEY].items():
        if before.get(name) == digest:
            continue
        if name not in read:
            reasons.append(f"source {name}: its files differ from the last ingest's (which did not list them)")
            continue
        now = source_files(stage_kind(spec.kind).read_settings(spec.config).sources[name]).files
        reasons.append(f"source {name}: {changed_files(read[name], now) or 'files changed'}")
    return reasons


def config_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """`dotted.key: old -> new` for every leaf that differs."""
    before, after = _flatten(old), _flatten(new)
    return [f"{key}: {before.get(key, '(unset)')!r} -> {after.get(key, '(unset)')!r}" for key in sorted(before.keys() | after.keys()) if before.get(key) != after.get(key)]


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(value, Mapping):
        return {prefix: value}
    flat: dict[str, Any] = {}
    for key, child in value.items():
        flat.update(_flatten(child, f"{prefix}.{key}" if prefix else str(key)))
    return flat
