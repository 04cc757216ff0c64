"""The run report: one self-contained HTML page for an experiment, plots embedded as PNG data URIs.

Pure: plain data in, bytes or text out. The same inputs give the same bytes (fixed figure size and
dpi, no PNG `Software` stamp, no timestamps), so the report can be published as an artifact.
matplotlib is imported when a plot is drawn: a report already published is found without it.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from factory.config.kinds import MetricsPlot

FIGSIZE_IN = (8.0, 4.0)
DPI = 100
LOSS_COLOUR = "#1f77b4"
EVAL_LOSS_COLOUR = "#d62728"
MFU_COLOUR = "#2ca02c"
"""Model FLOPs utilisation, on the right axis of the training plot (runs on GPUs)."""
BEST_COLOUR = "#ffbf00"
RL_CURVES = {"reward_mean": "mean reward", "pass_rate": "pass rate", "format_rate": "well-formed answers"}
SERIES_COLOURS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf")
CSS = (
    "body{font:14px/1.45 system-ui,sans-serif;max-width:960px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #ccc;padding:.2em .6em;text-align:left}"
    "td.n{text-align:right}pre{background:#f5f5f5;padding:.8em;overflow:auto}img{max-width:100%}"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalPoint:
    """One benchmark score of one checkpoint."""

    benchmark: str
    step: int
    value: float
    lower_is_better: bool
    checkpoint: str
    """The `checkpoints` partition key, `<experiment>__<stage>-<step:06d>`."""
    own_split: bool = False
    """Scored on the experiment's own held-out split (`val_bpb`): it compares with this experiment's other checkpoints, not
    with other experiments'."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StageCost:
    """One stage of the run: its artifact, whether it came from the cache, and what computing it took."""

    kind: str
    digest: str
    cache: Literal["hit", "miss"]
    seconds: float
    """Seconds it took when computed; 0 for a cache hit."""
    inputs: Mapping[str, str] = field(default_factory=dict)
    """Upstream name -> artifact digest."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingCurve:
    """The metrics log of one stage with checkpoints, drawn in a section of its own as its kind's plot says."""

    plot: MetricsPlot
    rows: Sequence[Mapping[str, Any]] = ()
    """Metrics rows: "step" and some of loss, lr, grad_norm, tokens_per_second, eval_loss (RL: reward_mean, pass_rate,
    format_rate, kl, ...); none when the experiment has no such stage."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReportInputs:
    """Everything the report shows."""

    experiment: str
    git_commit: str
    body_markdown: str = ""
    """The experiment file's Markdown body: the reasoning."""
    config_yaml: str = ""
    training: Sequence[Mapping[str, Any]] = ()
    """The main training's metrics rows, which the summary reads: "step" and some of loss, lr, grad_norm,
    tokens_per_second, eval_loss."""
    curves: Sequence[TrainingCurve] = ()
    """A section per kind with checkpoints, in the order the stages run."""
    evaluations: Sequence[EvalPoint] = ()
    stages: Sequence[StageCost] = ()
    control: Sequence[Mapping[str, Any]] = ()
    """Control decisions: step, rule, event, actions (or operations), optionally alert and message(s)."""
    links: Mapping[str, str] = field(default_factory=dict)
    """Name -> URL or plain value (tracker run, config commit)."""


def plot_training(rows: Sequence[Mapping[str, Any]], *, log_scale: bool = False) -> bytes:
    """PNG of training loss (and eval loss where logged) against step."""
    ax = _axes()
    loss, eval_loss = _series(rows, "loss"), _series(rows, "eval_loss")
    if not loss and not eval_loss:
        raise ValueError("no loss or eval_loss values to plot")
    if loss:
        ax.plot(*zip(*loss), color=LOSS_COLOUR, linewidth=1.8, label="training loss")
    if eval_loss:
        ax.plot(*zip(*eval_loss), color=EVAL_LOSS_COLOUR, linewidth=1.8, marker="o", markersize=4, label="eval loss")
    if log_scale:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter("{x:g}")  # 3 and 4, not 3x10^0
        ax.yaxis.set_minor_formatter("{x:g}")
    ax.set(xlabel="step", ylabel="loss", title="Training loss" + (" (log scale)" if log_scale else ""))
    if mfu := _series(rows, "mfu"):  # rows of a run on GPUs whose peak is known
        ax.plot([], [], color=MFU_COLOUR, linewidth=1.2, linestyle="--", label="MFU (right axis)")  # in the legend
        right = ax.twinx()
        right.plot([step for step, _ in mfu], [100 * value for _, value in mfu], color=MFU_COLOUR, linewidth=1.2, linestyle="--")
        right.set_ylabel("MFU (%)")
    return _png(ax)


def plot_rl(rows: Sequence[Mapping[str, Any]]) -> bytes:
    """PNG of the RL rewards (mean reward, pass rate, well-formed rate) against step, and the KL to the reference."""
    ax = _axes()
    for colour, (key, label) in zip(SERIES_COLOURS, RL_CURVES.items(), strict=False):
        if points := _series(rows, key):
            ax.plot(*zip(*points), color=colour, linewidth=1.8, label=label)
    ax.set(xlabel="step", ylabel="reward / rate", title="RL (GRPO)")
    if kl := _series(rows, "kl"):
        ax.plot([], [], color=EVAL_LOSS_COLOUR, linewidth=1.2, linestyle="--", label="KL to reference (right axis)")  # in the legend
        right = ax.twinx()
        right.plot(*zip(*kl), color=EVAL_LOSS_COLOUR, linewidth=1.2, linestyle="--")
        right.set_ylabel("KL")
    return _png(ax)


def has_rewards(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the rows hold anything plot_rl can draw."""
    return bool(_series(rows, "reward_mean"))


def plot_benchmark(points: Sequence[EvalPoint], benchmark: str) -> bytes:
    """PNG of one benchmark's score against step, a line per checkpoint series, the best point starred."""
    return _png(_benchmark_axes(points, benchmark))


def report_plots(inputs: ReportInputs) -> dict[str, bytes]:
    """Every plot the report shows, as PNG bytes by file name: each training curve's file and <benchmark>.png."""
    plots = {}
    for curve in inputs.curves:
        if curve.plot.curves == "rewards":
            if has_rewards(curve.rows):
                plots[curve.plot.file] = plot_rl(curve.rows)
        elif has_loss(curve.rows):  # a run that diverged to NaN has no curve to draw
            plots[curve.plot.file] = plot_training(curve.rows)
    for name in sorted({point.benchmark for point in inputs.evaluations}):
        plots[f"{name}.png"] = plot_benchmark(inputs.evaluations, name)
    return plots


def render_report(inputs: ReportInputs, plots: Mapping[str, bytes] | None = None) -> str:
    """The whole report as one HTML page; `plots` are `report_plots(inputs)` when they were drawn already."""
    plots = report_plots(inputs) if plots is None else plots
    title = f"Run report: {inputs.experiment}"
    parts = [
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title><style>{CSS}</style></head><body>',
        f"<h1>{_e(title)}</h1>",
        _section("Links", _links(inputs)),
        _section("Summary", _summary(inputs)),
        *(_section(c.plot.title, _img(plots[c.plot.file], c.plot.alt) if c.plot.file in plots else "") for c in inputs.curves),
        _section("Benchmarks", _benchmarks(inputs.evaluations, plots)),
        _section("Evaluations", _evaluations(inputs.evaluations)),
        _section("Control decisions", _control(inputs.control)),
        _section("Stages", _stages(inputs.stages)),
        _section("Lineage", _lineage(inputs.stages)),
        _section("Config", f"<pre>{_e(inputs.config_yaml)}</pre>" if inputs.config_yaml.strip() else ""),
        _section("Reasoning", _markdown(inputs.body_markdown)),
        "</body></html>\n",
    ]
    return "\n".join(parts)


def _axes() -> Axes:
    """The axes of a fresh figure of the fixed size, on its own Agg canvas (no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig.add_subplot()


def _png(ax: Axes) -> bytes:
    """The axes' figure as PNG bytes, with a grid, integer steps and the legend below the axes."""
    from matplotlib.ticker import MaxNLocator

    fig = ax.figure
    ax.grid(True, color="#dddddd", linewidth=0.8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    handles, _ = ax.get_legend_handles_labels()
    fig.legend(loc="outside lower center", ncols=min(len(handles), 4), frameon=False)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()


def _series(rows: Sequence[Mapping[str, Any]], key: str) -> list[tuple[int, float]]:
    """(step, value) pairs of the rows that log a finite `key`, by step."""
    return sorted((row["step"], float(row[key])) for row in rows if row.get(key) is not None and math.isfinite(row[key]))


def has_loss(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the rows hold anything plot_training can draw."""
    return bool(_series(rows, "loss") or _series(rows, "eval_loss"))


def _benchmark_axes(points: Sequence[EvalPoint], benchmark: str) -> Axes:
    """The benchmark plot, drawn."""
    mine = sorted((p for p in points if p.benchmark == benchmark), key=lambda p: (p.step, p.checkpoint))
    lower = _direction(mine, benchmark)
    ax = _axes()
    series = sorted({_series_name(p.checkpoint) for p in mine})
    for colour, name in zip(SERIES_COLOURS * len(series), series):
        line = [(p.step, p.value) for p in mine if _series_name(p.checkpoint) == name]
        ax.plot(*zip(*line), color=colour, linewidth=1.8, marker="o", markersize=4, label=name.rpartition("__")[2])
    best = _best(mine)
    ax.plot([best.step], [best.value], linestyle="none", marker="*", markersize=16, color=BEST_COLOUR,
            markeredgecolor="black", zorder=5, label=f"best: {best.value:.4g} at step {best.step}")
    ax.set(xlabel="step", ylabel=f"{benchmark} ({_better(lower)})", title=_label(mine, benchmark))
    return ax


def _direction(points: Sequence[EvalPoint], benchmark: str) -> bool:
    """Whether lower is better for the benchmark's points; they must have some and agree."""
    directions = {p.lower_is_better for p in points}
    if len(directions) != 1:
        raise ValueError(f"benchmark {benchmark!r} needs points that agree on lower_is_better, got {sorted(directions)}")
    return directions.pop()


def _better(lower_is_better: bool) -> str:
    """Which way is better, in words."""
    return "lower is better" if lower_is_better else "higher is better"


def _best(points: Sequence[EvalPoint]) -> EvalPoint:
    """The best point (the earliest of equals)."""
    sign = 1 if points[0].lower_is_better else -1
    return min(points, key=lambda p: (sign * p.value, p.step, p.checkpoint))


def _series_name(checkpoint: str) -> str:
    """A checkpoint's series: its partition key without the trailing step."""
    return re.sub(r"-\d+$", "", checkpoint)


def _e(value: Any) -> str:
    """Any value as escaped HTML text."""
    return html.escape(str(value), quote=True)


def _section(title: str, body: str) -> str:
    """A titled section; an empty body says "none"."""
    return f"<h2>{_e(title)}</h2>\n" + (body or "<p><em>none</em></p>")


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], numeric: Sequence[int] = ()) -> str:
    """An HTML table of escaped cells (no header row if `header` is empty); `numeric` columns align right; no rows gives ""."""
    if not rows:
        return ""
    head = f'<tr>{"".join(f"<th>{_e(h)}</th>" for h in header)}</tr>' if header else ""
    body = "".join(
        "<tr>" + "".join(f'<td{" class=n" if i in numeric else ""}>{_e(c)}</td>' for i, c in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<table>{head}{body}</table>"


def _img(png: bytes, alt: str) -> str:
    """An <img> holding the PNG as a data URI."""
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def _links(inputs: ReportInputs) -> str:
    """The git commit and the links; http(s) values become anchors, others stay text."""
    items = [("git commit", inputs.git_commit), *sorted(inputs.links.items())]
    lines = [
        f'<li>{_e(name)}: <a href="{_e(value)}">{_e(value)}</a></li>' if re.match(r"https?://", value)
        else f"<li>{_e(name)}: <code>{_e(value)}</code></li>"
        for name, value in items
    ]
    return "<ul>" + "".join(lines) + "</ul>"


def _summary(inputs: ReportInputs) -> str:
    """Key numbers: last step and losses, best score per benchmark, stage cost and cache hits."""
    loss, eval_loss = _series(inputs.training, "loss"), _series(inputs.training, "eval_loss")
    rows: list[tuple[str, str]] = []
    if loss:
        rows += [("last step", str(loss[-1][0])), ("final training loss", f"{loss[-1][1]:.4f}")]
    if eval_loss:
        rows.append(("best eval loss", f"{min(v for _, v in eval_loss):.4f}"))
    for name in sorted({p.benchmark for p in inputs.evaluations}):
        best = _best([p for p in inputs.evaluations if p.benchmark == name])
        rows.append((f"best {_label(inputs.evaluations, name)}", f"{best.value:.4f} ({best.checkpoint})"))
    rows.append(("control decisions", f"{len(inputs.control)}, {sum('alert' in c for c in inputs.control)} with an alert"))
    hits = sum(s.cache == "hit" for s in inputs.stages)
    rows.append(("stages", f"{len(inputs.stages)} ({hits} cache hits), {sum(s.seconds for s in inputs.stages):.1f} s computed"))
    return _table((), rows)


def _benchmarks(points: Sequence[EvalPoint], plots: Mapping[str, bytes]) -> str:
    """A heading and plot per benchmark."""
    names = sorted({p.benchmark for p in points})
    return "\n".join(
        f"<h3>{_e(_label(points, name))} ({_better(_direction([p for p in points if p.benchmark == name], name))})</h3>"
        + _img(plots[f"{name}.png"], f"{name} by step")
        for name in names
    )


def _evaluations(points: Sequence[EvalPoint]) -> str:
    """Every evaluation, by benchmark then step."""
    ordered = sorted(points, key=lambda p: (p.benchmark, p.step, p.checkpoint))
    return _table(("benchmark", "checkpoint", "step", "value"),
                  [(_label(points, p.benchmark), p.checkpoint, p.step, f"{p.value:.4f}") for p in ordered], numeric=(2, 3))


def _label(points: Sequence[EvalPoint], benchmark: str) -> str:
    """The benchmark's name, with `(own split)` when it was scored on the experiment's own held-out split."""
    return benchmark + (" (own split)" if any(p.own_split for p in points if p.benchmark == benchmark) else "")


def _control(decisions: Sequence[Mapping[str, Any]]) -> str:
    """What the control rules did, in step order."""
    rows = [
        (d["step"], d["event"], d["rule"], ", ".join(d.get("actions", d.get("operations", []))),
         d.get("alert", ""), d.get("message", "; ".join(d.get("messages", []))))
        for d in sorted(decisions, key=lambda d: d["step"])
    ]
    return _table(("step", "event", "rule", "actions", "alert", "message"), rows, numeric=(0,))


def _stages(stages: Sequence[StageCost]) -> str:
    """Each stage's artifact, cache outcome and seconds, with a total row."""
    rows = [(s.kind, s.digest[:12], s.cache, f"{s.seconds:.1f}") for s in stages]
    if rows:
        hits = sum(s.cache == "hit" for s in stages)
        rows.append(("total", "", f"{hits} of {len(stages)} hits", f"{sum(s.seconds for s in stages):.1f}"))
    return _table(("stage", "digest", "cache", "seconds"), rows, numeric=(3,))


def _lineage(stages: Sequence[StageCost]) -> str:
    """Each stage's inputs as shortened digests."""
    rows = [(f"{s.kind} {s.digest[:12]}", name, digest[:12]) for s in stages for name, digest in sorted(s.inputs.items())]
    return _table(("stage", "input", "input digest"), rows)


def _markdown(text: str) -> str:
    """Very small Markdown to HTML: headings, paragraphs, bullet lists (with indented continuations)."""
    out: list[str] = []
    paragraph: list[str] = []
    items: list[str] = []

    def close() -> None:
        if paragraph:
            out.append(f"<p>{_inline(' '.join(paragraph))}</p>")
        if items:
            out.append("<ul>" + "".join(f"<li>{_inline(item)}</li>" for item in items) + "</ul>")
        paragraph.clear()
        items.clear()

    for line in text.splitlines():
        stripped = line.strip()
        heading, bullet = re.match(r"(#{1,6})\s+(.*)", stripped), re.match(r"[-*]\s+(.*)", stripped)
        if heading:
            close()
            level = min(len(heading[1]) + 2, 6)  # h1 and h2 belong to the report
            out.append(f"<h{level}>{_inline(heading[2])}</h{level}>")
        elif bullet:
            if paragraph:
                close()
            items.append(bullet[1])
        elif stripped and items and line[:1].isspace():
            items[-1] += " " + stripped
        elif stripped:
            if items:
                close()
            paragraph.append(stripped)
        else:
            close()
    close()
    return "\n".join(out)


def _inline(text: str) -> str:
    """Escaped text with `code` spans and **bold**."""
    parts = re.split(r"`([^`]+)`", text)
    return "".join(
        f"<code>{_e(part)}</code>" if i % 2 else re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", _e(part))
        for i, part in enumerate(parts)
    )
