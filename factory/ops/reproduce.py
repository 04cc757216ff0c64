"""`factory reproduce MODEL`: run a model's lineage again, cache bypassed, and compare every stage's bytes.

Each stage that led to the model (data stages, blend, tokenizer, training, export) runs again from
its recorded config, in a scratch registry and catalog of its own, upstream first, reading the
artifacts the reproduction itself made. The code is the code the manifests recorded: this
checkout when its identity matches, else the recorded commit checked out into a git worktree.
Tables the lineage reads but does not write (a pinned task set) are copied into the scratch
catalog as they were.

A stage matches when its files hash the same; numbers that measure the run (timings, memory)
are left out of the comparison. The first stage that differs is explained: its code differs,
an input differs, it read data from outside the registry that changed since, or, with the same
code and inputs, the run is not deterministic. Each reproduction is recorded in the registry's
history (`reproductions/<model digest>`), which promotion reads.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from factory.config.fingerprint import code_identity, code_parts, source_tree_hash
from factory.config.kinds import model_kind, stage_kind
from factory.config.sources import source_files
from factory.config.stages import STAGES, StageSpec
from factory.data.catalog import CatalogConfig, open_catalog
from factory.errors import ArtifactError, ConfigError
from factory.launch.local import run_captured, stage_argv, warm_starts
from factory.registry import STORE_ENV
from factory.registry.seam import Registry
from factory.registry.store import ArtifactStore, Manifest, Provenance, read_required
from factory.ops.lineage import Lineage
from factory.ops.plan import FILES_KEY, source_changes
from factory.runtime import tracker_backend, warm_modules
from factory.runtime.request import StageRequest

PIPES_CONTEXT_ENV = "DAGSTER_PIPES_CONTEXT"
"""Where Dagster Pipes tells a stage the run it reports to (dagster_pipes' DAGSTER_PIPES_CONTEXT_ENV_VAR, not imported: the
commands that only read files load no Pipes); a reproduced stage reports to none."""
MEASUREMENTS = frozenset({"tokens_per_second", "step_seconds", "rss_peak_mb", "wall_seconds", "cpu_seconds", "seconds"})
MEASURED_SUFFIXES = ("_seconds", "_per_second", "_mb")
"""Keys that end so measure the run too (RL's `sync_seconds` and `rollout_seconds`, for one)."""
VERSION_LABEL = re.compile(r"v\d+")
"""Keys of JSON records that measure the run, not its result: left out when comparing files."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StageOutcome:
    """One stage of a reproduction."""

    kind: str
    recorded: str
    reproduced: str
    matched: bool
    reason: str = ""
    """Why it differs: `code: …`, `data: …` or `nondeterminism: …`; empty when it matched."""
    files: tuple[str, ...] = ()
    """Files whose bytes differ (measurements aside)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Reproduction:
    """A model's lineage run again: did every stage give the same bytes?"""

    model: str
    experiment: str
    code: str
    """How the code was obtained: `this checkout`, `worktree of <commit>`, or what could not be had."""
    stages: tuple[StageOutcome, ...]
    created: str = field(default_factory=lambda: datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))

    @property
    def matched(self) -> bool:
        """Whether every stage reproduced (and none was left out)."""
        return bool(self.stages) and all(s.matched for s in self.stages)

    @property
    def first_difference(self) -> StageOutcome | None:
        """The first stage that did not reproduce."""
        return next((s for s in self.stages if not s.matched), None)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form, as recorded in the registry's history."""
        return {**asdict(self), "matched": self.matched}


def reproductions(registry: Registry, model: str) -> list[dict[str, Any]]:
    """The recorded reproductions of a model, oldest first."""
    return registry.history(f"reproductions/{model}").records()


def reproduce(
    registry: Registry, catalog: CatalogConfig, model: Manifest, log: logging.Logger, *, keep_going: bool = False,
    repo: Path | None = None,
) -> Reproduction:
    """Run the model's lineage again in scratch stores and compare it stage by stage; the outcome is recorded."""
    if model.kind != model_kind().name:
        raise ConfigError(f"{model.digest[:12]} is a {model.kind} artifact; reproduce takes a model (factory lineage shows which)")
    graph = Lineage(registry)
    lineage = [m for m in graph.ancestors(model.digest) if m.kind in STAGES]
    tracker = tracker_backend(os.environ)
    with (tempfile.TemporaryDirectory(prefix="reproduce-", dir=registry.root.parent) as scratch,
          Sources(repo or Path.cwd(), Path(scratch)) as sources, contextlib.ExitStack() as warmed):
        scratch_catalog = CatalogConfig.local(Path(scratch) / "iceberg")
        scratch_registry = ArtifactStore(Path(scratch) / "registry")
        _copy_pinned_tables(open_catalog(catalog), open_catalog(scratch_catalog), graph, lineage, log)
        started = False
        made: dict[str, str] = {}  # recorded digest -> reproduced digest
        unmatched: set[str] = set()  # recorded digests whose reproduction differed
        outcomes: list[StageOutcome] = []
        for manifest in lineage:
            log.info("reproducing %s %s (%s)", manifest.kind, manifest.digest[:12], manifest.experiment)
            upstream = {name: made.get(digest, digest) for name, digest in manifest.inputs.items()}
            spec = StageSpec(kind=manifest.kind, config=manifest.config, upstream=upstream, code=manifest.code)
            request = StageRequest(
                spec=spec, registry=str(scratch_registry.root), catalog=scratch_catalog,
                provenance=Provenance(experiment=manifest.experiment, config_hash=manifest.config_hash, git_commit=manifest.git_commit,
                                      run_id="reproduce"),
                processes=int(manifest.summary.get("ranks", 1) or 1),
            )
            source = sources.source_for(manifest)
            if drift := _source_drift(manifest, registry):  # the stage would refuse to read other files than it records
                outcomes.append(StageOutcome(kind=manifest.kind, recorded=manifest.digest, reproduced="", matched=False,
                                             reason=f"data: it reads the datasets' sources from outside the registry, and they changed since: {drift}"))
                unmatched.add(manifest.digest)
                log.info("%s: %s", manifest.kind, outcomes[-1].reason)
                if keep_going:
                    continue
                break
            if source.pythonpath is None and not started:  # this checkout's stages fork from a warm interpreter, from the first on
                warmed.enter_context(warm_starts(warm_modules([m.kind for m in lineage], tracker)))
                started = True
            try:
                again = _run_stage(request, source, Path(scratch), warm_modules([manifest.kind], tracker))
            except ArtifactError as e:  # recorded too: a lineage that cannot run again did not reproduce
                outcomes.append(StageOutcome(kind=manifest.kind, recorded=manifest.digest, reproduced="", matched=False,
                                             reason=f"the stage failed when run again ({source.how}): {e}"))
                log.info("%s: failed: %s", manifest.kind, e)
                break
            made[manifest.digest] = again.digest
            differed = sorted(name for name, digest in manifest.inputs.items() if digest in unmatched)
            outcome = _compare(manifest, again, registry, scratch_registry, differed, source)
            if not outcome.matched:
                unmatched.add(manifest.digest)
            outcomes.append(outcome)
            log.info("%s: %s", manifest.kind, "same bytes" if outcome.matched else outcome.reason)
            if not outcome.matched and not keep_going:
                break
    result = Reproduction(model=model.digest, experiment=model.experiment, code="; ".join(sources.used), stages=tuple(outcomes))
    registry.history(f"reproductions/{model.digest}").append(result.to_json())
    return result


@dataclass(frozen=True, kw_only=True, slots=True)
class Source:
    """Where a stage's recorded code runs from."""

    cwd: Path
    pythonpath: str | None
    how: str
    differs: str
    """Why this is not the recorded code (empty when it is)."""


class Sources:
    """The recorded code of each stage: this checkout when it hashes the same, else a worktree of the recorded commit."""

    def __init__(self, repo: Path, scratch: Path) -> None:
        self.repo = repo
        self.scratch = scratch
        self.here = code_identity("local")
        self.worktrees: dict[str, Source] = {}
        self.used: list[str] = []

    def __enter__(self) -> Sources:
        return self

    def __exit__(self, *exc: object) -> None:
        for source in self.worktrees.values():
            if source.pythonpath:
                subprocess.run(["git", "-C", str(self.repo), "worktree", "remove", "--force", str(source.cwd)], capture_output=True)

    def source_for(self, manifest: Manifest) -> Source:
        """The code to reproduce `manifest` with."""
        source = self._find(manifest)
        if source.how not in self.used:
            self.used.append(source.how)
        return source

    def _find(self, manifest: Manifest) -> Source:
        here = Source(cwd=self.repo, pythonpath=None, how="this checkout", differs="")
        recorded = code_parts(manifest.code)["factory"]  # plugins run as installed here; their hashes say whether they changed
        if recorded == self.here:
            return here
        if not recorded.startswith("local:"):
            return Source(cwd=self.repo, pythonpath=None, how="this checkout",
                          differs=f"the stage ran in image {manifest.code}, which is not run here; this checkout ran it ({self.here})")
        commit = manifest.git_commit
        if commit.endswith("-dirty") or commit == "unknown":
            return Source(cwd=self.repo, pythonpath=None, how="this checkout",
                          differs=f"the stage ran uncommitted code ({manifest.code} at {commit}); this checkout is {self.here}")
        if commit not in self.worktrees:
            self.worktrees[commit] = self._worktree(commit)
        found = self.worktrees[commit]
        if found.differs:
            return found
        identity = "local:" + source_tree_hash(found.cwd / "factory")
        if identity != recorded:
            return Source(cwd=found.cwd, pythonpath=found.pythonpath, how=found.how,
                          differs=f"commit {commit[:12]} hashes to {identity}, the stage recorded {recorded}")
        return found

    def _worktree(self, commit: str) -> Source:
        path = self.scratch / f"src-{commit[:12]}"
        done = subprocess.run(["git", "-C", str(self.repo), "worktree", "add", "--detach", str(path), commit], capture_output=True, text=True)
        if done.returncode != 0:
            return Source(cwd=self.repo, pythonpath=None, how="this checkout",
                          differs=f"commit {commit[:12]} cannot be checked out here ({done.stderr.strip().splitlines()[-1:]}); this "
                                  f"checkout ran it ({self.here})")
        return Source(cwd=path, pythonpath=str(path), how=f"worktree of {commit[:12]}", differs="")


def _source_drift(manifest: Manifest, registry: Registry) -> str:
    """For a stage that reads sources outside the registry, which of their files changed since it ran ('' when none did,
    or when the stage recorded no listing)."""
    recorded = manifest.config.get(FILES_KEY)
    if not stage_kind(manifest.kind).reads_sources or not isinstance(recorded, dict):
        return ""
    try:
        settings = stage_kind(manifest.kind).read_settings(manifest.config)
        now = {name: source_files(config).digest for name, config in settings.sources.items()}
    except ConfigError as e:
        return str(e)
    if now == recorded:
        return ""
    today = StageSpec(kind=manifest.kind, config={**manifest.config, FILES_KEY: now}, upstream=manifest.inputs, code=manifest.code)
    return "; ".join(source_changes(manifest, today, registry))


def _run_stage(request: StageRequest, source: Source, scratch: Path, needs: Sequence[str]) -> Manifest:
    """Run one stage with the source's code (forked from the warm interpreter when that is this checkout's and imported
    `needs`); its manifest in the scratch registry."""
    path = request.write(scratch / f"{request.spec.kind}-{request.spec.fingerprint[:12]}.json")
    env = dict(os.environ)
    if source.pythonpath:  # another commit's code: the warm interpreter refuses it (it imported this checkout's)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [source.pythonpath, os.environ.get("PYTHONPATH")]))
    env.pop(PIPES_CONTEXT_ENV, None)
    env.pop(STORE_ENV, None)  # a reproduction computes into its scratch registry and catalog, on local disk
    code, stderr = run_captured(stage_argv(path, sys.executable, request.processes), env, source.cwd, [PIPES_CONTEXT_ENV, STORE_ENV],
                                needs)
    if code != 0:
        tail = "\n".join(stderr.strip().splitlines()[-15:])
        raise ArtifactError(f"reproducing {request.spec.kind} failed (exit {code}):\n{tail}")
    manifest = ArtifactStore(request.registry).lookup(request.spec.fingerprint)
    if manifest is None:
        raise ArtifactError(f"reproducing {request.spec.kind}: the stage exited 0 but published nothing")
    return manifest


def _compare(
    recorded: Manifest, again: Manifest, registry: Registry, scratch: Registry, changed: list[str], source: Source
) -> StageOutcome:
    base = StageOutcome(kind=recorded.kind, recorded=recorded.digest, reproduced=again.digest, matched=True)
    if again.digest == recorded.digest:
        return base
    names = sorted(set(recorded.files) | set(again.files))
    differ = tuple(name for name in names if not _same_file(name, recorded, again, registry, scratch))
    if not differ:
        return base  # only measurements of the run differ
    shown = ", ".join(differ[:5]) + (f" and {len(differ) - 5} more" if len(differ) > 5 else "")
    if source.differs:
        reason = f"code: {source.differs}; files that differ: {shown}"
    elif changed:
        reason = f"data: its input{'s' if len(changed) > 1 else ''} {', '.join(changed)} reproduced with other bytes; files that differ: {shown}"
    elif stage_kind(recorded.kind).reads_sources:
        reason = f"data: it reads the datasets' sources from outside the registry, and they changed since; files that differ: {shown}"
    else:
        reason = f"nondeterminism: the same code, config and inputs gave other bytes in {shown}"
    return StageOutcome(kind=recorded.kind, recorded=recorded.digest, reproduced=again.digest, matched=False, reason=reason, files=differ)


def _same_file(name: str, recorded: Manifest, again: Manifest, registry: Registry, scratch: Registry) -> bool:
    one, two = recorded.files.get(name), again.files.get(name)
    if one is None or two is None:
        return False
    if one["sha256"] == two["sha256"]:
        return True
    if not name.endswith((".json", ".jsonl")):
        return False
    return _results(name, read_required(registry, recorded, name)) == _results(name, read_required(scratch, again, name))  # those files alone


def measurement(key: str) -> bool:
    """Whether a record's key measures the run (a duration, a rate, memory) rather than what it computed."""
    return key in MEASUREMENTS or key.endswith(MEASURED_SUFFIXES)


def version_label(key: str, value: Any) -> bool:
    """Whether a record's value is the `vN` label a catalog gave a table version: it counts the versions written before
    (a fresh catalog starts again at v1), while the content tag beside it names what was written."""
    return key in ("tag", "version") and isinstance(value, str) and VERSION_LABEL.fullmatch(value) is not None


def _results(name: str, data: bytes) -> list[Any]:
    """The JSON records of a file (`name`, its bytes) with the measurements of the run left out."""
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if not measurement(k) and not version_label(k, v)}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    text = data.decode()
    lines = text.splitlines() if name.endswith(".jsonl") else [text]
    return [strip(json.loads(line)) for line in lines if line.strip()]


def _copy_pinned_tables(source: Any, target: Any, graph: Lineage, lineage: list[Manifest], log: logging.Logger) -> None:
    """Copy into the scratch catalog the table versions the lineage reads but none of its stages writes."""
    from factory.data.tables import resolve, write_version  # pyiceberg and pyarrow, only when reproducing

    written = {v for m in lineage for v in graph.written_by(m)}
    for version in {v for m in lineage for v in graph.read(m)} - written:
        if any(w.table == version.table and w.content_tag == version.content_tag for w in written):
            continue
        snapshot = resolve(source, version.table, version.tag)
        rows = source.load_table(version.table).scan(snapshot_id=snapshot).to_arrow()
        write_version(target, version.table, rows, log, tag=version.tag, schema=rows.schema)
