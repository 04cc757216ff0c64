"""The leaderboard: experiments x benchmarks, each experiment at its best checkpoint.

Rows come from the evaluation results in the registry (one per checkpoint x benchmark). An
experiment's best checkpoint is the one with the best score on the primary benchmark; the row
shows that checkpoint's score on every benchmark, so a row is one model, never a mix.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from factory.errors import ConfigError
from factory.registry.store import Manifest

PRIMARY = "val_bpb"
REGRESSION_TOLERANCE = 0.02
"""Relative: a candidate best may be at most 2% worse than the current best on any benchmark..."""
NOISE_SIGMAS = 2.0
"""...or, for a share of items (0 to 1), within this many standard errors of the best's share, if that is wider."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    """One experiment at its best checkpoint."""

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

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form."""
        return {name: dict(v) if isinstance(v := getattr(self, name), Mapping) else v for name in self.__slots__}


@dataclass(frozen=True, kw_only=True, slots=True)
class Board:
    """Ranked rows and the benchmarks they are scored on (name -> lower is better)."""

    rows: tuple[Row, ...]
    benchmarks: Mapping[str, bool]
    sort: str

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form."""
        return {"sort": self.sort, "benchmarks": dict(self.benchmarks), "rows": [row.to_json() for row in self.rows]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Board:
        """Inverse of `to_json`."""
        return cls(rows=tuple(Row(**row) for row in data["rows"]), benchmarks=data["benchmarks"], sort=data["sort"])


def stage_of(checkpoint: str) -> str:
    """The training stage of a checkpoint key `<experiment>__<stage>-<step>`."""
    return checkpoint.rpartition("__")[2].rpartition("-")[0]


def latest_results(manifests: Iterable[Manifest]) -> list[Manifest]:
    """The results that describe each experiment now: from the newest run of each of its training stages only
    (pretrain, sft, rl), each benchmark at its newest version only (versions are never compared), and the newest
    result per checkpoint x benchmark."""
    manifests = list(manifests)
    newest_training: dict[tuple[str, str], tuple[str, str]] = {}
    version: dict[str, int] = {}
    for m in manifests:
        s = m.summary
        run = (s["experiment"], stage_of(s["checkpoint"]))
        newest_training[run] = max(newest_training.get(run, ("", "")), (m.created, s.get("training", "")))
        version[s["benchmark"]] = max(version.get(s["benchmark"], 0), s["version"])
    newest: dict[tuple[str, str, str], Manifest] = {}
    for m in manifests:
        s = m.summary
        if s.get("training", "") != newest_training[(s["experiment"], stage_of(s["checkpoint"]))][1] or s["version"] != version[s["benchmark"]]:
            continue
        key = (s["experiment"], s["checkpoint"], s["benchmark"])
        if key not in newest or m.created >= newest[key].created:
            newest[key] = m
    return list(newest.values())


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
    """What each training stage of an experiment bought: its last evaluated checkpoint's score, in stage order."""
    last: dict[str, Manifest] = {}
    for m in latest_results(results):
        s = m.summary
        if s["experiment"] == experiment and s["benchmark"] == benchmark:
            stage = stage_of(s["checkpoint"])
            if stage not in last or s["step"] > last[stage].summary["step"]:
                last[stage] = m
    order = {stage: i for i, stage in enumerate(("pretrain", "sft", "rl"))}
    return [
        StageScore(stage=stage, checkpoint=m.summary["checkpoint"], step=m.summary["step"], value=m.summary["value"], count=m.summary["count"],
                   lower_is_better=bool(m.summary["lower_is_better"]))
        for stage, m in sorted(last.items(), key=lambda item: (order.get(item[0], len(order)), item[0]))
    ]


def build_board(results: Iterable[Manifest], tracker_urls: Mapping[str, str] | None = None, sort: str | None = None) -> Board:
    """Rank experiments by `sort` (default: the primary benchmark), each at its best checkpoint."""
    results = latest_results(results)
    benchmarks = {m.summary["benchmark"]: bool(m.summary["lower_is_better"]) for m in results}
    primary = PRIMARY if PRIMARY in benchmarks else min(benchmarks, default=PRIMARY)
    sort = sort or primary
    if benchmarks and sort not in benchmarks:
        raise ConfigError(f"no results for benchmark {sort!r} to sort by; benchmarks with results: {', '.join(sorted(benchmarks))}")
    by_experiment: dict[str, dict[str, dict[str, Manifest]]] = {}
    for manifest in results:
        s = manifest.summary
        by_experiment.setdefault(s["experiment"], {}).setdefault(s["checkpoint"], {})[s["benchmark"]] = manifest
    rows = [_best_row(name, checkpoints, primary, benchmarks, (tracker_urls or {}).get(name, "")) for name, checkpoints in by_experiment.items()]
    return Board(rows=tuple(sorted(rows, key=lambda row: _rank_key(row, sort, benchmarks.get(sort, True)))), benchmarks=benchmarks, sort=sort)


def _best_row(experiment: str, checkpoints: Mapping[str, Mapping[str, Manifest]], primary: str, benchmarks: Mapping[str, bool], url: str) -> Row:
    sign = 1 if benchmarks.get(primary, True) else -1
    scored = [name for name, results in checkpoints.items() if primary in results] or list(checkpoints)

    def standing(name: str) -> tuple[float, int]:
        result = checkpoints[name].get(primary)
        value = sign * result.summary["value"] if result else float("inf")
        return value, -next(iter(checkpoints[name].values())).summary["step"]  # ties: the later checkpoint

    best = min(scored, key=standing)
    results = checkpoints[best]
    first = next(iter(results.values()))
    return Row(
        experiment=experiment, checkpoint=best, step=first.summary["step"], tokens_seen=first.summary["tokens_seen"],
        scores={name: m.summary["value"] for name, m in sorted(results.items())},
        counts={name: m.summary["count"] for name, m in sorted(results.items())}, checkpoints_evaluated=len(checkpoints),
        git_commit=first.git_commit, tracker_url=url, digests={name: m.digest for name, m in sorted(results.items())},
    )


def _rank_key(row: Row, sort: str, lower_is_better: bool) -> tuple[int, float, str]:
    if sort not in row.scores:
        return (1, 0.0, row.experiment)
    return (0, row.scores[sort] if lower_is_better else -row.scores[sort], row.experiment)


def regressions(candidate: Row, best: Row, benchmarks: Mapping[str, bool], tolerance: float = REGRESSION_TOLERANCE) -> list[str]:
    """Each benchmark on which `candidate` is worse than `best` by more than the tolerance, said plainly.

    The tolerance is `tolerance` relative to the best's score; for a share of items (next-line matches, valid samples)
    it is at least NOISE_SIGMAS binomial standard errors, so a benchmark of 64 lines does not fail on one line's luck.
    """
    found = []
    for name in sorted(set(candidate.scores) & set(best.scores)):
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


def _short(commit: str) -> str:
    return commit[:12] + ("-dirty" if commit.endswith("-dirty") else "")


def render_markdown(board: Board) -> str:
    """A Markdown table of the board, in rank order."""
    names = sorted(board.benchmarks)
    arrows = {name: "↓" if board.benchmarks[name] else "↑" for name in names}
    lines = [
        "| rank | experiment | best checkpoint | " + " | ".join(f"{name} {arrows[name]}" for name in names) + " | tokens seen | commit | tracker |",
        "|---:|---|---|" + "---:|" * len(names) + "---:|---|---|",
    ]
    for rank, row in enumerate(board.rows, start=1):
        scores = " | ".join(f"{row.scores[name]:.4f}" if name in row.scores else "–" for name in names)
        tracker = f"[run]({row.tracker_url})" if row.tracker_url else ""
        lines.append(f"| {rank} | {row.experiment} | {row.checkpoint} | {scores} | {row.tokens_seen:,} | {_short(row.git_commit)} | {tracker} |")
    if not board.rows:
        lines.append("| | no evaluations yet | |" + " |" * len(names) + " | | |")
    return "\n".join(lines)


def render_html(board: Board) -> str:
    """A static, self-contained HTML page of the board; clicking a column header sorts by it."""
    names = sorted(board.benchmarks)
    headers = ["rank", "experiment", "best checkpoint", *(f"{n} {'↓' if board.benchmarks[n] else '↑'}" for n in names), "tokens seen", "commit", "tracker"]
    body = []
    for rank, row in enumerate(board.rows, start=1):
        cells = [f'<td data-v="{rank}">{rank}</td>', f"<td>{html.escape(row.experiment)}</td>", f"<td>{html.escape(row.checkpoint)}</td>"]
        for name in names:
            value = row.scores.get(name)
            cells.append(f'<td data-v="{value}">{value:.4f}</td>' if value is not None else '<td data-v="">–</td>')
        link = f'<a href="{html.escape(row.tracker_url)}">run</a>' if row.tracker_url else ""
        cells += [f'<td data-v="{row.tokens_seen}">{row.tokens_seen:,}</td>', f"<td><code>{html.escape(_short(row.git_commit))}</code></td>", f"<td>{link}</td>"]
        body.append("<tr>" + "".join(cells) + "</tr>")
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    return HTML_PAGE.format(head=head, body="\n".join(body) or f'<tr><td colspan="{len(headers)}">no evaluations yet</td></tr>',
                            sort=html.escape(board.sort), data=html.escape(json.dumps(board.to_json())))


HTML_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>leaderboard</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}
th{{cursor:pointer;background:#f4f4f4}}td:nth-child(2),td:nth-child(3){{text-align:left}}</style></head>
<body><h1>leaderboard</h1><p>Each experiment at its best checkpoint, ranked by {sort}. Click a header to sort.</p>
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
