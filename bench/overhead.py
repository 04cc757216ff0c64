"""What the factory costs on top of the work: the tiny experiment through `factory run` vs. the same stage functions
called in one process, side by side in one run, each on a fresh root.

The in-process baseline is a fresh process (one per round) that imports everything first, then calls each stage's
runner (lease, compute, publish), the evaluator, the leaderboard and the run report directly: no Dagster, no processes,
no imports on the clock. The factory side is `factory run` as a user types it: the command line, a Dagster instance, a
process per stage. Both compute the same fingerprints from the same code, so they do the same work. Rounds alternate
which side goes first; the ratio of each round, the per-stage table (medians) and the last round's timeline are printed. Printed for reference:
the ratio to that process timed from its start, what a user's script would wait for (interpreter start and imports on
its clock).

Per-stage overhead is the issue's measure: (wall time of the stages' Dagster run) - (the work each stage process
reports), divided by the number of stages.

`--smoke` runs one round of a much smaller variant of the experiment (a few files, a few steps; the same stages and
benchmarks): seconds instead of minutes, so the test suite checks that the bench still runs (its ratio means little).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from factory.config import config_hash, load, plan_stage, upstream_of
from factory.config.stages import stages_of
from factory.data.catalog import CatalogConfig, open_catalog
from factory.evals.benchmarks import benchmark
from factory.evals.heldout import REF, write_heldout_corpus
from factory.registry import ArtifactStore, Provenance
from factory.runtime import every_warm_module
from factory.runtime.request import StageRequest
from smoke import write_smoke_experiment  # bench/smoke.py (the script's directory is on sys.path)

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = REPO / "experiments" / "tiny-code-lm.md"
STEP_EVENTS = ("STEP_START", "STEP_SUCCESS")
LOG = logging.getLogger("bench.overhead")


def in_process(root: Path, path: Path) -> dict[str, float]:
    """Every stage, the evaluations, the leaderboard and the report, called in this process: wall seconds of each."""
    from factory.runtime.__main__ import run
    from factory.stages.evaluation import CheckpointRef, EvalItem, batch_provenance, batch_spec
    from factory.evals.publish import current_board, publish_leaderboard
    from factory.evals.run_report import publish_report, report_inputs
    from factory.train.records import published

    experiment = load(path)
    registry = ArtifactStore(root / "registry")
    catalog = CatalogConfig.local(root / "iceberg")
    provenance = Provenance(experiment=experiment.name, config_hash=config_hash(experiment), git_commit="bench")
    times, digests, fingerprints = {}, {}, {}
    for kind in stages_of(experiment):
        spec = plan_stage(experiment, kind, {name: digests[name] for name in upstream_of(experiment, kind)})
        started = time.perf_counter()
        run(StageRequest(spec=spec, registry=str(registry.root), catalog=catalog, provenance=provenance))
        times[kind] = time.perf_counter() - started
        digests[kind], fingerprints[kind] = registry.lookup(spec.fingerprint).digest, spec.fingerprint
    started = time.perf_counter()
    training = registry.lookup(fingerprints["pretrain"])
    spec = plan_stage(experiment, "pretrain", {name: digests[name] for name in upstream_of(experiment, "pretrain")})
    items = []
    for checkpoint in published(registry.path(training.digest)):
        ref = CheckpointRef(key=f"{experiment.name}__pretrain-{checkpoint.step:06d}", experiment=experiment.name, step=checkpoint.step,
                            tokens_seen=int(checkpoint.metrics.get("tokens_seen", 0)), path=str(checkpoint.path), sha256=checkpoint.sha256,
                            training=spec.to_json(), git_commit="bench",
                            eval={"max_bytes": experiment.eval.max_bytes, "batch_size": experiment.eval.batch_size})
        items += [EvalItem(partition=f"{name}|{ref.key}", benchmark=name, checkpoint=ref) for name in experiment.eval.benchmarks]
    if any(benchmark(name).data == REF for name in experiment.eval.benchmarks):  # what the evaluations asset does first, once
        write_heldout_corpus(open_catalog(catalog), LOG)
    batch = batch_spec(tuple(items), spec.code)
    run(StageRequest(spec=batch, registry=str(registry.root), catalog=catalog, provenance=batch_provenance(tuple(items), batch.config, "")))
    times["evaluations"] = time.perf_counter() - started
    started = time.perf_counter()
    publish_leaderboard(registry, current_board(registry), "bench")
    publish_report(registry, report_inputs(registry, experiment, {k: (f, "miss") for k, f in fingerprints.items()}, "bench"))
    times["leaderboard, report"] = time.perf_counter() - started
    return times


def through_factory(root: Path, path: Path) -> tuple[float, dict[str, tuple[float, float]], list[tuple[str, float]]]:
    """`factory run` on a fresh root: its wall time; each stage's (Dagster step wall, work the stage reported); and the
    timeline: the wall time of each Dagster run and of what came before, between and after them."""
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "factory", "run", str(path), "--root", str(root)], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "FACTORY_PROGRESS": "0"})
    ended = time.time()
    if done.returncode != 0:
        sys.exit(f"factory run failed:\n{done.stderr[-3000:]}")
    steps, timeline = run_times(root, started, ended)
    registry = ArtifactStore(root / "registry")
    work = {m.kind: float(m.summary.get("wall_seconds", 0.0)) for m in registry.manifests() if "wall_seconds" in m.summary}
    return ended - started, {kind: (seconds, work.get(kind, 0.0)) for kind, seconds in steps.items()}, timeline


def run_times(root: Path, started: float, ended: float) -> tuple[dict[str, float], list[tuple[str, float]]]:
    """Seconds of every step of the stages' run (the instance's first), and the timeline of all its runs."""
    from dagster import DagsterEventType, DagsterInstance

    with DagsterInstance.from_config(str(root / "dagster")) as instance:
        runs = list(reversed(instance.get_runs()))
        records = instance.all_logs(runs[0].run_id)
        starts = {r.step_key: r.timestamp for r in records if r.dagster_event and r.dagster_event.event_type == DagsterEventType.STEP_START}
        ends = {r.step_key: r.timestamp for r in records if r.dagster_event and r.dagster_event.event_type == DagsterEventType.STEP_SUCCESS}
        timeline, previous = [], started
        for run in runs:
            stats = instance.get_run_stats(run.run_id)
            steps = sorted(run.step_keys_to_execute or []) or ["run"]
            timeline += [("(before and between runs)", stats.start_time - previous), (", ".join(steps)[:40], stats.end_time - stats.start_time)]
            previous = stats.end_time
        timeline.append(("(after the last run)", ended - previous))
    return {key: ends[key] - starts[key] for key in starts if key in ends}, timeline


def fresh_process(root: Path, path: Path) -> tuple[float, float, dict[str, float]]:
    """The stages called in a fresh process of their own: its whole wall time (interpreter start and imports included),
    its time after the imports, and each stage's time."""
    result = root / "times.json"
    started = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--script", str(root), str(result), str(path)], check=True,
                   env={**os.environ, "FACTORY_PROGRESS": "0"})
    whole = time.perf_counter() - started
    measured = json.loads(result.read_text())
    return whole, measured["wall"], measured["times"]


def script(root: Path, result: Path, path: Path) -> None:
    """The fresh process's side: imports first, off the clock of `wall`, then every call."""
    for module in every_warm_module():
        importlib.import_module(module)
    LOG.addHandler(logging.NullHandler())
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # each stage prints its materialization when not under Pipes
        times = in_process(root, path)
    result.write_text(json.dumps({"wall": time.perf_counter() - started, "times": times}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of both sides (default 2)")
    parser.add_argument("--smoke", action="store_true", help="one round of a much smaller experiment: checks the bench runs")
    parser.add_argument("--script", nargs=3, type=Path, help=argparse.SUPPRESS)  # ROOT RESULT EXPERIMENT: the fresh process's side
    args = parser.parse_args()
    os.environ.setdefault("FACTORY_TRACKER", "none")  # both sides alike; tracking is measured by bench/trainer.py
    if args.script:
        script(*args.script)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = write_smoke_experiment(Path(tmp)) if args.smoke else EXPERIMENT
        compare(path, 1 if args.smoke else args.rounds)


def compare(path: Path, rounds: int) -> None:
    """`rounds` alternating rounds of both sides on the experiment file `path`; prints each round, the medians, the ratios."""
    ratios, scripts, rows = [], [], []  # rows: per round, each stage's (in one process, factory step, work reported)
    for round_ in range(rounds):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            sides = [lambda: fresh_process(Path(a), path), lambda: through_factory(Path(b), path)]
            if round_ % 2:
                sides.reverse()
            outcomes = [side() for side in sides]
            (whole, baseline_wall, baseline), (wall, steps, timeline) = outcomes if round_ % 2 == 0 else outcomes[::-1]
        ratios.append(wall / baseline_wall)
        scripts.append(wall / whole)
        stages = [kind for kind in baseline if kind in steps]
        work = sum(steps[kind][1] for kind in stages)
        run_wall = timeline[1][1]  # the first run materializes the stages
        per_stage = (run_wall - work) / len(stages)
        print(f"round {round_ + 1}: in one process {baseline_wall:.1f} s ({whole:.1f} s with its start and imports); factory run "
              f"{wall:.1f} s; ratio {ratios[-1]:.3f}x; per-stage overhead {per_stage:.2f} s ({len(stages)} stages: run {run_wall:.1f} s, "
              f"work {work:.1f} s)", flush=True)
        rows.append({kind: (baseline[kind], *steps.get(kind, (float("nan"), float("nan")))) for kind in baseline})
    print(f"\nmedians over the rounds\n{'stage':<22}{'in one process':>16}{'factory step':>14}{'work reported':>15}{'overhead':>10}")
    for kind in rows[0]:
        alone, step, work = (statistics.median(row[kind][i] for row in rows) for i in range(3))
        print(f"{kind:<22}{alone:>15.2f}s{step:>13.2f}s{work:>14.2f}s{step - work:>9.2f}s")
    print("\nfactory run, its timeline (last round):")
    for name, seconds in timeline:
        print(f"  {name:<42}{seconds:>7.2f}s")
    print(f"\nratio factory run / in one process: median {statistics.median(ratios):.3f}x over {len(ratios)} round(s) (goal <= 1.15x)")
    print(f"ratio factory run / the same process timed from its start (imports on its clock): median {statistics.median(scripts):.3f}x")
    print(json.dumps({"ratios": [round(r, 3) for r in ratios], "with_imports": [round(r, 3) for r in scripts]}))


if __name__ == "__main__":
    main()
