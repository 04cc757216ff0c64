"""The leaderboard: experiments x benchmarks, each experiment at the model it exported.

Rows come from the evaluation results in the registry (one per checkpoint x benchmark). A row is
the checkpoint the experiment's `model` stage exported (the final one of its last training stage),
so the board, `best_model`, `factory promote` and Podium name the same weights; the row shows that
checkpoint's score on every benchmark, so a row is one model, never a mix. An experiment whose newest
run exported no model (interrupted, or still training) is shown at its newest checkpoint, marked
`unfinished`, never ranked and never `best_model`. The board ranks by its primary benchmark: the one
asked for, else the one most experiments' files name (`eval.primary`), else `heldout_bpb`.

Only scores of the same benchmark version on the same data compare (`factory.evals.scored_on`):
`val_bpb` is measured on each experiment's own held-out split, `heldout_bpb` on a pinned table
every experiment shares. The board ranks the rows whose score on the sort benchmark is on the
data most rows were scored on; the others follow, unranked, with a note saying why, and every
cell scored on other data than the rest of its column is marked.
"""

from __future__ import annotations

import html
import json
import logging
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from factory.config.stages import TRAINING_STAGES
from factory.errors import ConfigError
from factory.evals.scored_on import UNRECORDED, data_of, describe, is_own_split, is_shared
from factory.registry.store import Manifest

PRIMARY = "heldout_bpb"
"""Ranks the board unless the experiment files name another (`eval.primary`): bits per byte on data every experiment shares."""
FALLBACK = "val_bpb"
"""The primary benchmark on a board without heldout_bpb results (each experiment's own split: it ranks only rows on the same data)."""
UNFINISHED = "unfinished"
"""Opens the note of a row whose run exported no model."""
NOT_COMPARABLE = "*"
"""Marks a score measured on other data than the rest of its column."""
REGRESSION_TOLERANCE = 0.02
"""Relative: a candidate best may be at most 2% worse than the current best on any benchmark..."""
NOISE_SIGMAS = 2.0
"""...or, for a share of items (0 to 1), within this many standard errors of the best's share, if that is wider."""
RESULT_KEYS: Mapping[str, type | tuple[type, ...]] = {
    "benchmark": str, "version": int, "lower_is_better": bool, "value": (int, float), "count": int,
    "checkpoint": str, "experiment": str, "step": int, "tokens_seen": int,
}
"""What the board reads from an evaluation result's summary, and its type."""

log = logging.getLogger(__name__)
_warned: set[str] = set()


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    """One experiment at the checkpoint its model stage exported (or, unfinished, its newest)."""

    experiment: str
    checkpoint: str
    step: int
    tokens_seen: int
    scores: Mapping[str, float]
    counts: Mapping[str, int]
    """Items each score covers (lines, samples, bytes): how noisy it is."""
    checkpoints_evaluated: int
    git_commit: str
    tracker_url: str = ""
    digests: Mapping[str, str] = field(default_factory=dict)
    """The evaluation artifact behind each score."""
    data: Mapping[str, str] = field(default_factory=dict)
    """The data each score was measured on (`factory.evals.scored_on`)."""
    versions: Mapping[str, int] = field(default_factory=dict)
    """The benchmark version of each score."""
    ranked: bool = True
    """False when the row has no score on the sort benchmark comparable with the ranked rows'."""
    note: str = ""
    """Why the row is not ranked."""
    base: str = ""
    """The model the experiment started from when made elsewhere (`from`, and the model's digest); empty for its own."""
    model: str = ""
    """The digest of the model artifact its model stage exported from this checkpoint; empty for an unfinished run."""
    finished: bool = True
    """False when the checkpoint's run exported no model (interrupted, or still training): never ranked, never best."""

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form."""
        return {"experiment": self.experiment, "checkpoint": self.checkpoint, "step": self.step, "tokens_seen": self.tokens_seen,
                "scores": dict(self.scores), "counts": dict(self.counts), "checkpoints_evaluated": self.checkpoints_evaluated,
                "git_commit": self.git_commit, "tracker_url": self.tracker_url, "digests": dict(self.digests), "data": dict(self.data),
                "versions": dict(self.versions), "ranked": self.ranked, "note": self.note, "base": self.base, "model": self.model,
                "finished": self.finished}

    def scored_on(self, benchmark: str) -> str:
        """The data identity of the row's score on `benchmark` (a row from before identities were recorded: unrecorded)."""
        return self.data.get(benchmark) or f"{UNRECORDED}{self.experiment}"

    def compares_with(self, other: Row, benchmark: str) -> bool:
        """Whether both rows have a score on `benchmark` of the same version, measured on the same data."""
        return (benchmark in self.scores and benchmark in other.scores and self.versions.get(benchmark) == other.versions.get(benchmark)
                and self.scored_on(benchmark) == other.scored_on(benchmark))


@dataclass(frozen=True, kw_only=True, slots=True)
class Runs:
    """What the registry says of the training runs behind the results."""

    exported: Mapping[str, str] = field(default_factory=dict)
    """{training stage fingerprint: digest of the model a model stage exported from that stage's final weights}."""
    steps: Mapping[str, int] = field(default_factory=dict)
    """{training stage fingerprint: the step its final weights are at}, for the stages that published their artifact."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Board:
    """Ranked rows and the benchmarks they are scored on (name -> lower is better)."""

    rows: tuple[Row, ...]
    benchmarks: Mapping[str, bool]
    sort: str
    data: Mapping[str, str] = field(default_factory=dict)
    """The data each benchmark's column compares on: what most rows were scored on. The sort benchmark's ranks the rows."""

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form."""
        return {"sort": self.sort, "benchmarks": dict(self.benchmarks), "data": dict(self.data), "rows": [row.to_json() for row in self.rows]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Board:
        """Inverse of `to_json` (a board published before columns recorded their data has none)."""
        return cls(rows=tuple(Row(**row) for row in data["rows"]), benchmarks=data["benchmarks"], sort=data["sort"], data=data.get("data", {}))

    def comparable(self, row: Row, benchmark: str) -> bool:
        """Whether the row's score on `benchmark` was measured on the data its column compares on (True without a score)."""
        return benchmark not in row.scores or benchmark not in self.data or row.scored_on(benchmark) == self.data[benchmark]


def stage_of(checkpoint: str) -> str:
    """The training stage of a checkpoint key `<experiment>__<stage>-<step>`."""
    return checkpoint.rpartition("__")[2].rpartition("-")[0]


def latest_results(manifests: Iterable[Manifest], versions: Mapping[str, int] | None = None) -> list[Manifest]:
    """The results that describe each experiment now: from the newest run of each of its training stages only
    (pretrain, sft, rl), each benchmark at its newest version only (versions are never compared: `versions`, the newest of
    each benchmark on the whole board, when `manifests` are one experiment's), and the newest result per checkpoint x
    benchmark."""
    manifests = list(well_formed(manifests))
    newest_training: dict[tuple[str, str], tuple[str, str]] = {}
    for m in manifests:
        s = m.summary
        run = (s["experiment"], stage_of(s["checkpoint"]))
        newest_training[run] = max(newest_training.get(run, ("", "")), (m.created, s.get("training", "")))
    version = newest_versions(manifests) if versions is None else versions
    newest: dict[tuple[str, str, str], Manifest] = {}
    for m in manifests:
        s = m.summary
        if s.get("training", "") != newest_training[(s["experiment"], stage_of(s["checkpoint"]))][1] or s["version"] != version.get(s["benchmark"]):
            continue
        key = (s["experiment"], s["checkpoint"], s["benchmark"])
        if key not in newest or m.created >= newest[key].created:
            newest[key] = m
    return list(newest.values())


def newest_versions(results: Iterable[Manifest]) -> dict[str, int]:
    """The newest version of each benchmark among well-formed `results`."""
    version: dict[str, int] = {}
    for m in results:
        version[m.summary["benchmark"]] = max(version.get(m.summary["benchmark"], 0), m.summary["version"])
    return version


def well_formed(results: Iterable[Manifest]) -> Iterator[Manifest]:
    """The results whose summary holds every key the board reads, of its type, and names the experiment the manifest
    belongs to (as the evaluator publishes them); any other is skipped with a warning (once per manifest), so one damaged
    result never hides the board."""
    for manifest in results:
        bad = [key for key, kind in RESULT_KEYS.items() if not isinstance(manifest.summary.get(key), kind)]
        if not bad and manifest.summary["experiment"] == manifest.experiment:
            yield manifest
        elif manifest.fingerprint not in _warned:
            _warned.add(manifest.fingerprint)
            why = (f"lacks {', '.join(bad)}" if bad else
                   f"names experiment {manifest.summary['experiment'][:80]!r}, its manifest {manifest.experiment!r}")
            log.warning("skipping evaluation result %s (manifests/%s.json): summary %s", manifest.digest[:12], manifest.fingerprint, why)


@dataclass(frozen=True, kw_only=True, slots=True)
class StageScore:
    """A training stage's last evaluated checkpoint on one benchmark."""

    stage: str
    checkpoint: str
    step: int
    value: float
    count: int
    lower_is_better: bool


def stage_scores(results: Iterable[Manifest], experiment: str, benchmark: str) -> list[StageScore]:
    """What each training stage of an experiment bought: its last evaluated checkpoint's score, in stage order, each after
    the score of the weights it started from when it saved them (`checkpoint_at_start`: its step 0, as `<stage> (start)`)."""
    last: dict[str, Manifest] = {}
    start: dict[str, Manifest] = {}
    for m in latest_results(results):
        s = m.summary
        if s["experiment"] == experiment and s["benchmark"] == benchmark:
            stage = stage_of(s["checkpoint"])
            if stage not in last or s["step"] > last[stage].summary["step"]:
                last[stage] = m
            if s["step"] == 0:
                start[stage] = m
    order = {stage: i for i, stage in enumerate(TRAINING_STAGES)}
    scores = []
    for stage, m in sorted(last.items(), key=lambda item: (order.get(item[0], len(order)), item[0])):
        if stage in start and start[stage] is not m:
            scores.append(_stage_score(f"{stage} (start)", start[stage]))
        scores.append(_stage_score(stage, m))
    return scores


def _stage_score(stage: str, result: Manifest) -> StageScore:
    s = result.summary
    return StageScore(stage=stage, checkpoint=s["checkpoint"], step=s["step"], value=s["value"], count=s["count"],
                      lower_is_better=bool(s["lower_is_better"]))


@dataclass(frozen=True, kw_only=True, slots=True)
class Entry:
    """One experiment's part of the board: what its own results say, with what the registry says of the training runs
    they name (finished, exported: those runs and their models may be other experiments' manifests), and which version of
    each of its benchmarks is the newest on the whole board (`under`). The board merges the entries, so a change to the
    registry computes again only the entries it touches (`factory.evals.publish`)."""

    experiment: str
    versions: Mapping[str, int]
    """The newest version of each benchmark among its results, of every run."""
    under: Mapping[str, int]
    """The newest version of each of those benchmarks on the whole board when the entry was computed."""
    row: Row | None
    """At the checkpoint it exported (or its newest), before ranking; None without a result of those versions."""
    created: Mapping[str, str] = field(default_factory=dict)
    """When each of the row's scores was published (a column's tie between data goes to the newest)."""
    directions: Mapping[str, tuple[str, str, bool]] = field(default_factory=dict)
    """Each benchmark of its latest results: the newest one's (created, fingerprint, lower is better). The board takes a
    benchmark's direction from its newest result of all (ties of `created`: the greatest fingerprint)."""
    primary: tuple[str, str, str] = ("", "", "")
    """Its newest latest result's (created, fingerprint, the primary benchmark its file names or ""): what its file names
    now (ties of `created`: the greatest fingerprint)."""
    trainings: tuple[str, ...] = ()
    """The training runs (stage fingerprints) its latest results name: a change to one of them computes it again."""

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form."""
        return {"experiment": self.experiment, "versions": dict(self.versions), "under": dict(self.under),
                "row": self.row.to_json() if self.row is not None else None, "created": dict(self.created),
                "directions": {name: list(d) for name, d in self.directions.items()}, "primary": list(self.primary),
                "trainings": list(self.trainings)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Entry:
        """Inverse of `to_json`."""
        return cls(experiment=data["experiment"], versions=data["versions"], under=data["under"],
                   row=Row(**data["row"]) if data["row"] is not None else None, created=data["created"],
                   directions={name: (d[0], d[1], bool(d[2])) for name, d in data["directions"].items()},
                   primary=tuple(data["primary"]), trainings=tuple(data["trainings"]))

    def stale(self, versions: Mapping[str, int]) -> bool:
        """Whether the board's newest versions of its benchmarks are no longer those it was computed under."""
        return any(versions.get(name) != self.under.get(name) for name in self.versions)


def entry_of(experiment: str, results: Iterable[Manifest], versions: Mapping[str, int], runs: Runs, url: str = "", base: str = "") -> Entry:
    """An experiment's entry from its results (those of other experiments are ignored), with `versions` the newest of each
    benchmark on the whole board, `runs` what the registry says of the runs they name, its main training's tracker
    link and the model it started from when made elsewhere."""
    results = [m for m in well_formed(results) if m.summary["experiment"] == experiment]
    own = newest_versions(results)
    under = {name: versions[name] for name in own if name in versions}
    latest = latest_results(results, versions)
    if not latest:
        return Entry(experiment=experiment, versions=own, under=under, row=None)
    checkpoints: dict[str, dict[str, Manifest]] = {}
    directions: dict[str, tuple[str, str, bool]] = {}
    for m in latest:
        checkpoints.setdefault(m.summary["checkpoint"], {})[m.summary["benchmark"]] = m
        directions[m.summary["benchmark"]] = max(directions.get(m.summary["benchmark"], ("", "", True)),
                                                 (m.created, m.fingerprint, bool(m.summary["lower_is_better"])))
    newest = max(latest, key=lambda m: (m.created, m.fingerprint))
    checkpoint, finished = _exported_checkpoint(checkpoints, runs)
    chosen = checkpoints[checkpoint]
    return Entry(experiment=experiment, versions=own, under=under, row=_row(experiment, chosen, len(checkpoints), url, base, finished, runs),
                 created={name: m.created for name, m in chosen.items()}, directions=directions,
                 primary=(newest.created, newest.fingerprint, str(newest.summary.get("primary") or "")),
                 trainings=tuple(sorted({m.summary.get("training", "") for m in latest})))


def build_board(
    results: Iterable[Manifest], runs: Runs, tracker_urls: Mapping[str, str] | None = None, sort: str | None = None,
    bases: Mapping[str, str] | None = None,
) -> Board:
    """Rank experiments, each at the model it exported, by `sort` (default: the primary benchmark most of their files
    name); rows whose score is on other data than most rows', and unfinished runs, follow unranked."""
    return merge(entries_of(results, runs, tracker_urls or {}, bases or {}).values(), sort)


def entries_of(results: Iterable[Manifest], runs: Runs, tracker_urls: Mapping[str, str], bases: Mapping[str, str]) -> dict[str, Entry]:
    """Every experiment's entry from all the results on the board (`runs`, the links and bases as `build_board` takes them)."""
    results = list(well_formed(results))
    versions = newest_versions(results)
    by_experiment: dict[str, list[Manifest]] = {}
    for manifest in results:
        by_experiment.setdefault(manifest.summary["experiment"], []).append(manifest)
    return {name: entry_of(name, own, versions, runs, tracker_urls.get(name, ""), bases.get(name, "")) for name, own in by_experiment.items()}


def merge(entries: Iterable[Entry], sort: str | None = None) -> Board:
    """The board of the experiments' entries (all computed under the same newest versions), ranked by `sort` (default:
    the primary benchmark most of their files name)."""
    rows = {entry.experiment: entry for entry in sorted(entries, key=lambda entry: entry.experiment) if entry.row is not None}
    directions: dict[str, tuple[str, str, bool]] = {}
    for entry in rows.values():
        for name, direction in entry.directions.items():
            directions[name] = max(directions.get(name, direction), direction)
    benchmarks = {name: direction[2] for name, direction in sorted(directions.items())}
    sort = sort or primary_of(rows.values(), benchmarks)
    if benchmarks and sort not in benchmarks:
        raise ConfigError(f"no results for benchmark {sort!r} to rank by; benchmarks with results: {', '.join(sorted(benchmarks))}")
    ranked_on = _common_data((name, entry.row.data[sort], entry.created[sort]) for name, entry in rows.items()
                             if sort in entry.row.scores and entry.row.finished)
    ranked = [_ranked(entry.row, sort, ranked_on) for entry in rows.values()]
    ranked.sort(key=lambda row: _rank_key(row, sort, benchmarks.get(sort, True)))
    place = {row.experiment: i for i, row in enumerate(ranked)}  # the other columns' ties go to the data of the higher-placed row
    columns = {name: _common_data(((e, entry.row.data[name], entry.created[name]) for e, entry in rows.items() if name in entry.row.scores), place)
               for name in benchmarks}
    return Board(rows=tuple(ranked), benchmarks=benchmarks, sort=sort, data={**columns, sort: ranked_on})


def primary_of(entries: Iterable[Entry], benchmarks: Mapping[str, bool]) -> str:
    """The benchmark most experiments' files rank by (`eval.primary`, recorded with their results: an experiment's
    newest result says what its file names now; a file without one: heldout_bpb, else val_bpb, whichever has results);
    ties go to that default."""
    default = next((name for name in (PRIMARY, FALLBACK) if name in benchmarks), min(benchmarks, default=PRIMARY))
    votes = Counter(primary if (primary := entry.primary[2]) in benchmarks else default for entry in entries)
    return max(votes, key=lambda name: (votes[name], name == default, name), default=default)


def _exported_checkpoint(checkpoints: Mapping[str, Mapping[str, Manifest]], runs: Runs) -> tuple[str, bool]:
    """The checkpoint the experiment's model stage exported (the final one of an exported training stage) and True; for a
    run that exported no model, its newest checkpoint (in stage order, then step) and False."""
    order = {stage: i for i, stage in enumerate(TRAINING_STAGES)}

    def newest(name: str) -> tuple[int, int, str]:
        return order.get(stage_of(name), len(order)), next(iter(checkpoints[name].values())).summary["step"], name

    exported = [name for name, results in checkpoints.items()
                if (training := next(iter(results.values())).summary.get("training", "")) in runs.exported
                and next(iter(results.values())).summary["step"] == runs.steps.get(training)]
    return (max(exported, key=newest), True) if exported else (max(checkpoints, key=newest), False)


def _common_data(scored: Iterable[tuple[str, str, str]], place: Mapping[str, int] | None = None) -> str:
    """The data most members (experiments) were scored on, of (member, data, when published); ties go to shared data,
    then to the data of the member placed first in `place` (without it: of the newest results)."""
    members: dict[str, set[str]] = {}
    newest: dict[str, str] = {}
    for member, data, created in scored:
        members.setdefault(data, set()).add(member)
        newest[data] = max(newest.get(data, ""), created)

    def preference(data: str) -> tuple:
        first = -min(place[member] for member in members[data]) if place is not None else 0
        return (len(members[data]), is_shared(data), first, newest[data], data)

    return max(members, key=preference, default="")


def _row(experiment: str, results: Mapping[str, Manifest], evaluated: int, url: str, base: str, finished: bool, runs: Runs) -> Row:
    """One experiment at one checkpoint: its score on every benchmark (ranked later, by `_ranked`)."""
    first = next(iter(results.values()))
    stage = stage_of(first.summary["checkpoint"])
    return Row(
        experiment=experiment, checkpoint=first.summary["checkpoint"], step=first.summary["step"], tokens_seen=first.summary["tokens_seen"],
        scores={name: m.summary["value"] for name, m in sorted(results.items())},
        counts={name: m.summary["count"] for name, m in sorted(results.items())}, checkpoints_evaluated=evaluated,
        git_commit=first.git_commit, tracker_url=url, digests={name: m.digest for name, m in sorted(results.items())},
        data={name: data_of(m.summary) for name, m in sorted(results.items())},
        versions={name: m.summary["version"] for name, m in sorted(results.items())}, ranked=finished,
        note="" if finished else f"{UNFINISHED}: its {stage} run exported no model (interrupted, or still training)", base=base,
        model=runs.exported.get(first.summary.get("training", ""), "") if finished else "", finished=finished,
    )


def _ranked(row: Row, sort: str, ranked_on: str) -> Row:
    """The row, ranked by `sort` when it is finished and its score on it was measured on `ranked_on`, else saying why not."""
    note = (row.note if not row.finished else f"no {sort} score" if sort not in row.data else
            f"{sort} on {describe(row.data[sort])}, not comparable with the ranked rows' ({describe(ranked_on)})"
            if row.data[sort] != ranked_on else "")
    return row if (row.ranked, row.note) == (not note, note) else replace(row, ranked=not note, note=note)  # most rows are as they were


def _rank_key(row: Row, sort: str, lower_is_better: bool) -> tuple[int, str, float, str]:
    """Ranked rows by score; then unranked ones, grouped by the data they were scored on, and those without a score last."""
    if sort not in row.scores:
        return (2, "", 0.0, row.experiment)
    value = row.scores[sort] if lower_is_better else -row.scores[sort]
    value = value if math.isfinite(value) else math.inf  # a score that is not a number (a diverged run) after the others
    return (0, "", value, row.experiment) if row.ranked else (1, row.scored_on(sort), value, row.experiment)


def leader(board: Board) -> Row | None:
    """The row `best_model` may mark: the first, when it is ranked (a finished run's exported model on comparable data)."""
    return board.rows[0] if board.rows and board.rows[0].ranked else None


def regressions(candidate: Row, best: Row, benchmarks: Mapping[str, bool], tolerance: float = REGRESSION_TOLERANCE) -> list[str]:
    """Each benchmark on which `candidate` is worse than `best` by more than the tolerance, said plainly; only scores that
    compare (same version, same data) are compared.

    The tolerance is `tolerance` relative to the best's score; for a share of items (next-line matches, valid samples)
    it is at least NOISE_SIGMAS binomial standard errors, so a benchmark of 64 lines does not fail on one line's luck.
    """
    found = []
    for name in sorted(n for n in set(candidate.scores) & set(best.scores) if candidate.compares_with(best, n)):
        new, old = candidate.scores[name], best.scores[name]
        lower = benchmarks.get(name, True)
        worse_by = (new - old) if lower else (old - new)
        allowed = tolerance * max(abs(old), 1e-12)
        count = best.counts.get(name, 0)
        if not lower and 0.0 <= old <= 1.0 and count:
            allowed = max(allowed, NOISE_SIGMAS * math.sqrt(max(old * (1 - old), 1 / count) / count))
        if worse_by > allowed:
            found.append(f"{name}: {new:.4f} vs {old:.4f} for the current best {best.experiment} ({best.checkpoint}), "
                         f"worse by {worse_by:.4f} where {allowed:.4f} is allowed ({'lower' if lower else 'higher'} is better)")
    return found


def held_back(leader: Row, best: Row, board: Board, tolerance: float = REGRESSION_TOLERANCE) -> list[str]:
    """Why the board's leader may not replace the current best model (empty when it may): it leads on its own held-out split,
    which the best was not scored on, or it regresses on a benchmark both were scored on alike."""
    if not leader.ranked:
        return [f"{leader.experiment} is not ranked: {leader.note}"]
    on = leader.scored_on(board.sort)
    if not is_shared(on) and not leader.compares_with(best, board.sort):
        return [f"{leader.experiment} leads on {board.sort} measured on {describe(on)}, which the current best {best.experiment} "
                f"({best.checkpoint}) was not scored on: not comparable, so it is not marked best"]
    return regressions(leader, best, board.benchmarks, tolerance)


def heading(board: Board, benchmark: str) -> str:
    """A column's title: the name, `(own split)` when most rows were scored on their own held-out split, the direction."""
    own = " (own split)" if is_own_split(board.data.get(benchmark, "")) else ""
    return f"{benchmark}{own} {'↓' if board.benchmarks[benchmark] else '↑'}"


def cell(board: Board, row: Row, benchmark: str) -> str:
    """A score as shown: 4 decimals, marked when measured on other data than its column; `–` without one."""
    if benchmark not in row.scores:
        return "–"
    return f"{row.scores[benchmark]:.4f}" + ("" if board.comparable(row, benchmark) else NOT_COMPARABLE)


def ranks(board: Board) -> list[str]:
    """The rank of each row as shown: 1, 2, ... for ranked rows, `–` for the others."""
    return [str(i) if row.ranked else "–" for i, row in enumerate(board.rows, start=1)]


def legend(board: Board) -> str:
    """What the marks mean, when some cell has one."""
    marked = any(not board.comparable(row, name) for row in board.rows for name in board.benchmarks)
    return f"{NOT_COMPARABLE} measured on other data than the rest of its column: not comparable with it." if marked else ""


def model_cell(row: Row) -> str:
    """The exported model as the CLI names it everywhere (`factory lineage`, `factory promote`): its digest's first 12
    digits; `unfinished` for a run that exported none."""
    return row.model[:12] if row.model else UNFINISHED if not row.finished else ""


def _short(commit: str) -> str:
    return commit[:12] + ("-dirty" if commit.endswith("-dirty") else "")


def render_markdown(board: Board) -> str:
    """A Markdown table of the board, in rank order."""
    names = sorted(board.benchmarks)
    columns = ["rank", "experiment", "model", "checkpoint", *(heading(board, name) for name in names), "tokens seen", "commit", "tracker",
               "base", "note"]
    lines = [
        "| " + " | ".join(columns) + " |",
        "|---:|---|---|---|" + "---:|" * len(names) + "---:|---|---|---|---|",
    ]
    for rank, row in zip(ranks(board), board.rows, strict=True):
        scores = " | ".join(cell(board, row, name) for name in names)
        tracker = f"[run]({row.tracker_url})" if row.tracker_url else ""
        lines.append(f"| {rank} | {row.experiment} | {model_cell(row)} | {row.checkpoint} | {scores} | {row.tokens_seen:,} | {_short(row.git_commit)} "
                     f"| {tracker} | {row.base} | {row.note} |")
    if not board.rows:
        lines.append("| | no evaluations yet | | |" + " |" * len(names) + " | | | | |")
    return "\n".join(lines) + (f"\n\n{note}" if (note := legend(board)) else "")


def render_html(board: Board) -> str:
    """A static, self-contained HTML page of the board; clicking a column header sorts by it."""
    names = sorted(board.benchmarks)
    headers = ["rank", "experiment", "model", "checkpoint", *(heading(board, n) for n in names), "tokens seen", "commit", "tracker", "base",
               "note"]
    body = []
    for rank, row in zip(ranks(board), board.rows, strict=True):
        cells = [f'<td data-v="{rank if row.ranked else ""}">{rank}</td>', f"<td>{html.escape(row.experiment)}</td>",
                 f"<td><code>{html.escape(model_cell(row))}</code></td>", f"<td>{html.escape(row.checkpoint)}</td>"]
        for name in names:
            value = row.scores.get(name)
            other = "" if board.comparable(row, name) else f' class="nc" title="measured on {html.escape(describe(row.scored_on(name)))}"'
            cells.append(f'<td data-v="{value}"{other}>{html.escape(cell(board, row, name))}</td>' if value is not None else '<td data-v="">–</td>')
        link = f'<a href="{html.escape(row.tracker_url)}">run</a>' if row.tracker_url else ""
        cells += [f'<td data-v="{row.tokens_seen}">{row.tokens_seen:,}</td>', f"<td><code>{html.escape(_short(row.git_commit))}</code></td>",
                  f"<td>{link}</td>", f"<td>{html.escape(row.base)}</td>", f"<td>{html.escape(row.note)}</td>"]
        body.append("<tr>" + "".join(cells) + "</tr>")
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    return HTML_PAGE.format(head=head, body="\n".join(body) or f'<tr><td colspan="{len(headers)}">no evaluations yet</td></tr>',
                            sort=html.escape(board.sort), legend=html.escape(legend(board)), data=html.escape(json.dumps(board.to_json())))


HTML_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>leaderboard</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}
th{{cursor:pointer;background:#f4f4f4}}td:nth-child(2),td:nth-child(3),td:nth-child(4),td:last-child{{text-align:left}}td.nc{{color:#888}}</style></head>
<body><h1>leaderboard</h1><p>Each experiment at the model it exported, ranked by {sort}; rows scored on other data, and unfinished runs, follow
unranked.
Click a header to sort.</p><p>{legend}</p>
<table id="board"><thead><tr>{head}</tr></thead><tbody>
{body}
</tbody></table>
<script type="application/json" id="data">{data}</script>
<script>
document.querySelectorAll("#board th").forEach((th, i) => th.addEventListener("click", () => {{
  const body = document.querySelector("#board tbody"), rows = Array.from(body.rows);
  const key = r => {{ const c = r.cells[i], v = c.dataset.v; return v === undefined ? c.textContent : (v === "" ? Infinity : parseFloat(v)); }};
  const up = th.dataset.up !== "1"; th.dataset.up = up ? "1" : "0";
  rows.sort((a, b) => (key(a) > key(b) ? 1 : key(a) < key(b) ? -1 : 0) * (up ? 1 : -1)).forEach(r => body.appendChild(r));
}}));
</script></body></html>
"""
