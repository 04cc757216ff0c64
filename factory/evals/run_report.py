"""An experiment's run report, assembled from the registry and published as an immutable artifact."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping

import yaml

from factory.config.fingerprint import code_identity, sha256_of
from factory.config.kinds import main_training_kind, stage_kinds
from factory.config.schema import Experiment
from factory.errors import ArtifactError
from factory.evals.base import EVALUATIONS
from factory.evals.leaderboard import latest_results
from factory.evals.report import EvalPoint, ReportInputs, StageCost, TrainingCurve, render_report, report_plots
from factory.evals.scored_on import data_of, is_own_split
from factory.registry.index import Where
from factory.registry.layout import CONTROL_FILE, METRICS_FILE, REPORT_FILE
from factory.registry.seam import Registry
from factory.registry.store import Manifest, Provenance

KIND = "run_report"


def report_inputs(registry: Registry, experiment: Experiment, stages: Mapping[str, tuple[str, str]], git_commit: str) -> ReportInputs:
    """What the report shows; `stages` maps each stage the experiment ran to (its fingerprint, "hit" or "miss")."""
    manifests = {kind: registry.lookup(fingerprint) for kind, (fingerprint, _) in stages.items()}
    training = manifests.get(main_training_kind().name)
    links = {"config commit": git_commit}
    if training is not None and training.summary.get("tracker_url"):
        links["tracker run"] = training.summary["tracker_url"]
    return ReportInputs(
        experiment=experiment.name,
        git_commit=git_commit,
        body_markdown=experiment.description,
        config_yaml=yaml.safe_dump(experiment.model_dump(mode="json", exclude={"name", "description", "source"}), sort_keys=False),
        training=_metrics(registry, training),
        curves=[TrainingCurve(plot=kind.metrics_plot(), rows=_metrics(registry, manifests.get(kind.name)))
                for kind in stage_kinds() if kind.checkpoints],
        evaluations=[_point(m) for m in latest_results(registry.manifests(EVALUATIONS, Where(experiment=experiment.name)))
                     if m.summary["experiment"] == experiment.name],
        stages=[_cost(kind, manifests[kind], cache) for kind, (_, cache) in stages.items()],
        control=_jsonl(registry.read(training, CONTROL_FILE)) if training else [],
        links=links,
    )


def _metrics(registry: Registry, manifest: Manifest | None) -> list[dict]:
    """The metrics log of a training stage's artifact (none when the experiment has no such stage)."""
    return _jsonl(registry.read(manifest, METRICS_FILE)) if manifest else []


def _jsonl(data: bytes | None) -> list[dict]:
    """The records of a JSON-lines file read from an artifact (none when it has no such file)."""
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()] if data is not None else []


def _point(manifest: Manifest) -> EvalPoint:
    s = manifest.summary
    return EvalPoint(benchmark=s["benchmark"], step=s["step"], value=s["value"], lower_is_better=s["lower_is_better"], checkpoint=s["checkpoint"],
                     own_split=is_own_split(data_of(s)))


def _cost(kind: str, manifest: Manifest | None, cache: str) -> StageCost:
    """A stage's CPU-seconds when this run computed it; 0 when it came from the cache (or is gone from the registry)."""
    if manifest is None:
        return StageCost(kind=kind, digest="missing from the registry", cache="miss", seconds=0.0)
    seconds = 0.0 if cache == "hit" else float(manifest.summary.get("cpu_seconds", 0.0))
    return StageCost(kind=kind, digest=manifest.digest, cache="hit" if cache == "hit" else "miss", seconds=seconds, inputs=dict(manifest.inputs))


def publish_report(registry: Registry, inputs: ReportInputs) -> Manifest:
    """Publish the report (the HTML page, plus its plots as PNG files for other viewers); a report of the same inputs,
    drawn by the same code, is found without drawing it again. Its plots are those of an earlier report of the experiment
    whose plots had the same inputs (a rerun's report differs in its stages' costs alone), read rather than drawn again."""
    code = code_identity("local")
    fingerprint = sha256_of({"kind": KIND, "inputs": _hashed(dataclasses.asdict(inputs)), "code": code})
    manifest = registry.lookup(fingerprint)
    if manifest is not None:
        return manifest
    plotted = sha256_of({"plots": _hashed({"curves": [dataclasses.asdict(c) for c in inputs.curves],
                                            "evaluations": [dataclasses.asdict(e) for e in inputs.evaluations]}), "code": code})
    drawn, plots = _drawn_before(registry, inputs.experiment, plotted)
    if plots is None:
        plots = report_plots(inputs)  # drawn once: embedded in the page, and as files for other viewers
    with registry.staging() as out:
        (out / REPORT_FILE).write_text(render_report(inputs, plots))
        for name, png in plots.items():
            (out / name).write_bytes(png)
        return registry.publish(
            out, kind=KIND, fingerprint=fingerprint, config={}, inputs={stage.kind: stage.digest for stage in inputs.stages},
            code=code, provenance=Provenance(experiment=inputs.experiment, config_hash=fingerprint[:16], git_commit=inputs.git_commit),
            summary={"evaluations": len(inputs.evaluations), "control_decisions": len(inputs.control), PLOTS: plotted,
                     PLOT_FILES: sorted(plots), **({PLOTS_FROM: drawn} if drawn else {})},
        )


PLOTS = "plots"
"""A report's summary: the fingerprint of what its plots show (the curves and evaluations) and of the code that draws them."""
PLOT_FILES = "plot_files"
PLOTS_FROM = "plots_from"
"""A report's summary: the report whose plots it copied, when it drew none."""


def _hashed(value: object) -> str:
    shown = json.dumps(value, sort_keys=True, default=str)  # metrics may hold NaN: not canonical JSON
    return hashlib.sha256(shown.encode()).hexdigest()


def _drawn_before(registry: Registry, experiment: str, plotted: str) -> tuple[str | None, dict[str, bytes] | None]:
    """(the report, its plots by file name) of an earlier report of `experiment` whose plots are those `plotted` names;
    (None, None) when none has them all, whole."""
    for earlier in registry.manifests(KIND, Where(experiment=experiment)):
        if earlier.summary.get(PLOTS) != plotted:
            continue
        try:
            plots = {name: registry.read(earlier, name) for name in earlier.summary.get(PLOT_FILES, ())}
        except ArtifactError:  # a file of it missing or damaged: the next one, or drawn again
            continue
        if all(png is not None for png in plots.values()):
            return earlier.summary.get(PLOTS_FROM, earlier.digest), plots  # type: ignore[return-value]
    return None, None
