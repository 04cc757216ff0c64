"""`factory registry gc`: remove the artifacts nothing needs any more, after a dry run that lists them and what they free.

An artifact is kept, for the first of these reasons found (the dry run shows it):
- an experiment at HEAD needs it: a stage `factory plan` finds cached, or an artifact a stage to run starts from;
- it is the newest artifact made for an experiment at HEAD by one of its stages (what it has until a run makes the next:
  a change of code or config leaves the last model standing);
- an alias names it or named it (a demotion goes back to the model named before), or a ref names it (the newest
  leaderboard and best model, and the checkpoint of the best model's result);
- a stage computing now reads it (its lease lists its inputs: `Holder.needs`);
- it was published less than `min_age_s` ago (a run of an experiment that is not at HEAD may be about to read it);
- it is in the lineage of one of those: an input, transitively, or the model a `from:` started from;
- it describes a kept artifact: an evaluation result of a kept checkpoint, the run report of an experiment whose stages
  are all kept.
Everything else is garbage. So is a stage's work directory (the checkpoints of a run that stopped, kept to resume from)
whose stage no experiment at HEAD plans, or whose artifact is published already, unless a stage holds its lease or it
changed within `min_age_s`. Removal goes artifact by artifact, newest first (a dependent before what it was made from):
take its lease without waiting (one being computed right now is skipped), read the leases again (a stage that started
since the plan may read it; read at most once a second), then remove its manifest (from then on the artifact does not
exist: a lookup misses and its stage computes it again) and its files, unless another manifest names the same bytes.

What this cannot see: a process that read a manifest before the removal and opens the artifact's files after it. A
stage says what it reads in its lease, but a `factory podium` or `reproduce` session does not; `min_age_s` is the margin.
Table versions in the catalog and MLflow runs are not the registry's, and stay.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from factory.collector import collector_paused
from factory.config import Experiment
from factory.config.stages import PENDING, stages_of
from factory.evals.base import EVALUATIONS
from factory.evals.publish import BEST_REF
from factory.evals.publish import KIND as LEADERBOARD
from factory.evals.run_report import KIND as RUN_REPORT
from factory.registry.aliases import history, known_aliases
from factory.registry.index import ManifestRow
from factory.registry.lease import LeaseBusy, abandoned
from factory.registry.seam import Registry

REFS = (LEADERBOARD, BEST_REF)
"""The refs the evaluations keep up to date (`factory.evals.publish`): what each names is kept."""
MIN_AGE_S = 24 * 3600.0
"""What `factory registry gc --min-age-hours` defaults to (24), in seconds."""
READERS_TTL_S = 1.0
"""How long a removal trusts the leases it read last for what the stages computing now read."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Collection:
    """What a collection keeps (digest -> why) and what it would remove."""

    keep: dict[str, str]
    garbage: list[ManifestRow]
    """Newest first."""
    bytes: int
    """What removing the garbage frees (bytes two garbage manifests share counted once, work directories included)."""
    work: dict[str, int] = field(default_factory=dict)
    """The stale work directories: fingerprint -> their bytes on this machine and in the object store."""

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form."""
        return {"kept": len(self.keep), "garbage": [describe(m) for m in self.garbage],
                "work": [{"fingerprint": fingerprint, "bytes": size} for fingerprint, size in sorted(self.work.items())], "bytes": self.bytes}


@dataclass(kw_only=True, slots=True)
class Removal:
    """What a collection removed, and what it left because someone was using it."""

    removed: list[ManifestRow] = field(default_factory=list)
    bytes: int = 0
    in_use: list[tuple[ManifestRow, str]] = field(default_factory=list)
    work: list[str] = field(default_factory=list)
    """The fingerprints whose work directories it removed."""
    work_in_use: list[tuple[str, str]] = field(default_factory=list)


def describe(manifest: ManifestRow) -> dict[str, Any]:
    """One line of the dry run, as data."""
    return {"kind": manifest.kind, "digest": manifest.digest, "experiment": manifest.experiment, "created": manifest.created,
            "bytes": manifest.size}


def plan_collection(registry: Registry, experiments: Iterable[Experiment], *, min_age_s: float = MIN_AGE_S,
                    now: datetime | None = None, rows: list[ManifestRow] | None = None) -> Collection:
    """Decide what to keep and what to remove (the module's rules); nothing is removed. The registry's manifests are
    walked as the index's rows (`Registry.rows`, or `rows` a caller read from it just before), none parsed."""
    with collector_paused():  # a dict entry or a list for each of 100,000 rows, all kept until the plan is made
        return _plan(registry, list(experiments), min_age_s, now, registry.rows() if rows is None else rows)


def _plan(registry: Registry, experiments: list[Experiment], min_age_s: float, now: datetime | None,
          manifests: list[ManifestRow]) -> Collection:
    """`plan_collection` over the rows `manifests`."""
    by_digest: dict[str, list[ManifestRow]] = {}
    for manifest in manifests:
        by_digest.setdefault(manifest.digest, []).append(manifest)
    keep: dict[str, str] = {}
    planned: set[str] = set()
    roots = {**needed_by_experiments(registry, experiments, planned), **named(registry, by_digest), **in_use(registry)}
    newest: dict[tuple[str, str], ManifestRow] = {}
    for manifest in manifests:  # in fingerprint order: ties of `created` go to one of them, the same every time
        if (key := (manifest.experiment, manifest.kind)) not in newest or manifest.created > newest[key].created:
            newest[key] = manifest
    for experiment in experiments:
        for kind in stages_of(experiment):
            if (last := newest.get((experiment.name, kind))) is not None:
                roots.setdefault(last.digest, f"{experiment.name}: its newest {kind}")
    cutoff = (now or datetime.now(UTC)).timestamp() - min_age_s
    roots.update({m.digest: "published less than the minimum age ago" for m in manifests if _created(m) > cutoff and m.digest not in roots})
    _close(roots, by_digest, keep)
    while described := {m.digest: f"describes {subject[:12]}" for m in manifests if m.digest not in keep
                        and (subject := _subject(m, keep)) is not None}:
        _close(described, by_digest, keep)  # their inputs are kept too
    garbage = sorted((m for m in manifests if m.digest not in keep), key=lambda m: (m.created, m.fingerprint), reverse=True)
    freed = {m.digest: m.size for m in garbage}
    published = {m.fingerprint for m in manifests}
    work = {fingerprint: size for fingerprint, (size, changed) in registry.works().items()
            if (fingerprint in published or fingerprint not in planned) and changed <= cutoff}
    return Collection(keep=keep, garbage=garbage, bytes=sum(freed.values()) + sum(work.values()), work=work)


def collect(registry: Registry, collection: Collection, *, owner: str | None = None) -> Removal:
    """Remove the garbage of a planned collection, artifact by artifact (module docstring); what is in use now stays."""
    owner = owner or f"factory registry gc (pid {os.getpid()} on {socket.gethostname()})"
    removal = Removal()
    readers: dict[str, str] = {}
    read_at = -math.inf
    for fingerprint, size in sorted(collection.work.items()):
        try:
            with registry.lease(fingerprint, owner, wait=False):
                registry.drop_work(fingerprint)
                removal.work.append(fingerprint)
                removal.bytes += size
        except LeaseBusy as e:
            removal.work_in_use.append((fingerprint, f"{e.holder.owner} is computing it"))
    for manifest in collection.garbage:
        try:
            with registry.lease(manifest.fingerprint, owner, wait=False):
                if time.monotonic() - read_at > READERS_TTL_S:  # the leases, read again (a LIST and a GET each on S3)
                    readers, read_at = in_use(registry), time.monotonic()
                if (reader := readers.get(manifest.digest)) is not None:
                    removal.in_use.append((manifest, reader))
                    continue
                if (freed := registry.remove(manifest)) is not None:  # it reads the manifest again: one replaced since stays
                    removal.removed.append(manifest)
                    removal.bytes += freed
        except LeaseBusy as e:
            removal.in_use.append((manifest, f"{e.holder.owner} is computing it"))
    return removal


def needed_by_experiments(registry: Registry, experiments: Iterable[Experiment], planned: set[str] | None = None) -> dict[str, str]:
    """Digest -> why, of what the experiments need now: each stage `factory plan` finds cached, and what each stage to run
    starts from. The fingerprint of every stage planned goes into `planned`."""
    from factory.ops.plan import planned_stages  # plans load the stage kinds' code

    needs: dict[str, str] = {}
    for stage in planned_stages(experiments, registry):
        name, kind = stage.experiment.name, stage.spec.kind
        if planned is not None:
            planned.add(stage.spec.fingerprint)
        if stage.manifest is not None:
            needs.setdefault(stage.manifest.digest, f"{name}: its {kind}")
        for upstream, digest in stage.spec.upstream.items():
            if not digest.startswith(PENDING):
                needs.setdefault(digest, f"{name}: {kind} starts from it ({upstream})")
    return needs


def named(registry: Registry, by_digest: dict[str, list[ManifestRow]]) -> dict[str, str]:
    """Digest -> why, of every model an alias names or named, of what each ref names, and of the checkpoint (training
    artifact) the best model's result scored."""
    found: dict[str, str] = {}
    for alias in known_aliases(registry):
        for record in history(registry, alias).records():
            if isinstance(model := record.get("model"), str):
                found.setdefault(model, f"alias {alias} names it" if record.get("action") == "promote" else f"alias {alias} named it")
    for ref in REFS:
        if (digest := registry.ref(ref)) is not None:
            found.setdefault(digest, f"ref {ref} names it")
    best = registry.ref(BEST_REF)
    for manifest in by_digest.get(best, []) if best is not None else []:
        for result in manifest.inputs:
            for scored in by_digest.get(result, []):
                if scored.training is not None:
                    found.setdefault(scored.training, f"ref {BEST_REF}: the checkpoint of its result")
    return found


def in_use(registry: Registry) -> dict[str, str]:
    """Digest -> why, of what the stages computing now read (their leases say)."""
    return {digest: f"{holder.owner} reads it" for holder in registry.holders() if abandoned(holder) is None for digest in holder.needs}


def parents(manifest: ManifestRow) -> list[str]:
    """The digests an artifact was made from: its inputs, and the model its experiment's `from:` started from."""
    return [*manifest.inputs, manifest.base_model] if manifest.base_model is not None else list(manifest.inputs)


def _close(roots: dict[str, str], by_digest: dict[str, list[ManifestRow]], keep: dict[str, str]) -> None:
    """Keep `roots` (for their own reasons) and everything they were made from, transitively."""
    todo = [digest for digest, why in roots.items() if keep.setdefault(digest, why) == why]
    while todo:
        digest = todo.pop()
        for manifest in by_digest.get(digest, ()):
            for parent in parents(manifest):
                if parent not in keep:
                    keep[parent] = f"made {digest[:12]} ({manifest.kind})"
                    todo.append(parent)


def _subject(manifest: ManifestRow, keep: dict[str, str]) -> str | None:
    """The kept artifact a result or report describes, or None: an evaluation result's checkpoint (the training artifact),
    a run report's stages (all of them kept)."""
    if manifest.kind == EVALUATIONS:
        return manifest.training if manifest.training in keep else None
    if manifest.kind == RUN_REPORT and manifest.inputs and all(d in keep for d in manifest.inputs):
        return manifest.inputs[0]
    return None


def _created(manifest: ManifestRow) -> float:
    """When the artifact was published (POSIX seconds); 0 for a date that does not parse (never "new")."""
    try:
        created = datetime.fromisoformat(manifest.created)
    except (TypeError, ValueError):
        return 0.0
    return (created if created.tzinfo else created.replace(tzinfo=UTC)).timestamp()
