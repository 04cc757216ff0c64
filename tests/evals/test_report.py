"""The run report: plots that show what they claim, an escaped self-contained page, the same bytes each time."""

import base64
import dataclasses
import io
import re

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from matplotlib.image import imread

from factory.config.kinds import StageKind, stage_kinds
from factory.evals.report import (
    BEST_COLOUR,
    EVAL_LOSS_COLOUR,
    LOSS_COLOUR,
    MFU_COLOUR,
    SERIES_COLOURS,
    EvalPoint,
    ReportInputs,
    StageCost,
    TrainingCurve,
    _benchmark_axes,
    plot_benchmark,
    plot_rl,
    plot_training,
    render_report,
)

FALLING = [{"step": step, "loss": 8.0 - 0.02 * step, "lr": 3e-3} for step in range(0, 301, 10)]
EVALS = [{"step": step, "eval_loss": 7.0 - 0.015 * step} for step in (100, 200, 300)]


def curves(**rows: list) -> tuple[TrainingCurve, ...]:
    """A section per kind with checkpoints, as the run report gives them, with the metrics rows given by kind."""
    return tuple(TrainingCurve(plot=kind.metrics_plot(), rows=rows.get(kind.name, ())) for kind in stage_kinds() if kind.checkpoints)


def point(benchmark: str, step: int, value: float, lower: bool, stage: str = "pretrain") -> EvalPoint:
    return EvalPoint(benchmark=benchmark, step=step, value=value, lower_is_better=lower, checkpoint=f"tiny__{stage}-{step:06d}")


RISING = [point("pass@1", step, value, lower=False) for step, value in ((300, 0.06), (100, 0.01), (200, 0.045))]  # out of order on purpose
BPB = [point("val_bpb", step, value, lower=True) for step, value in ((200, 2.2), (100, 2.9), (300, 1.5))]


def pixels(png: bytes) -> np.ndarray:
    """The PNG's RGB pixels, floats in [0, 1]."""
    return imread(io.BytesIO(png), format="png")[..., :3]


def plot_area(image: np.ndarray) -> tuple[slice, slice]:
    """Rows and columns strictly inside the axes frame (the longest dark lines), so the legend below is left out."""
    dark = image.sum(axis=-1) < 0.6
    columns = np.flatnonzero(dark.sum(axis=0) > 0.5 * dark.sum(axis=0).max())
    rows = np.flatnonzero(dark.sum(axis=1) > 0.5 * dark.sum(axis=1).max())
    return slice(rows[0] + 2, rows[-1] - 1), slice(columns[0] + 2, columns[-1] - 1)


def matching(image: np.ndarray, colour: str) -> np.ndarray:
    """Mask of the pixels of `colour` (antialiased edges left out)."""
    return np.all(np.abs(image - np.array(to_rgb(colour))) < 0.05, axis=-1)


def line_rows(png: bytes, colour: str) -> np.ndarray:
    """For each column inside the frame that the line crosses once, the mean screen row of its pixels."""
    image = pixels(png)
    rows, columns = plot_area(image)
    mask = matching(image[rows, columns], colour)
    means = []
    for column in mask.T:
        hit = np.flatnonzero(column)
        if hit.size and hit[-1] - hit[0] < hit.size + 2:  # one run, not two separate marks
            means.append(hit.mean())
    return np.array(means)


def test_training_plot_is_a_picture_not_a_blank():
    image = pixels(plot_training(FALLING))
    assert image.shape == (400, 800, 3)
    assert (image.sum(axis=-1) < 1.5).mean() > 0.01  # text, frame and line: dark pixels
    assert matching(image, LOSS_COLOUR).sum() > 500


def test_falling_loss_goes_down_the_screen_left_to_right():
    rows = line_rows(plot_training(FALLING), LOSS_COLOUR)
    assert len(rows) > 500  # the line spans most of the width
    assert rows[-1] - rows[0] > 200  # screen rows grow downwards: the right end is much lower
    assert np.all(np.diff(rows) > -1.0)  # and it never climbs back


def test_rising_loss_goes_up_the_screen():
    rising = [{"step": row["step"], "loss": 2.0 + 0.02 * row["step"]} for row in FALLING]
    rows = line_rows(plot_training(rising), LOSS_COLOUR)
    assert rows[0] - rows[-1] > 200


def test_eval_loss_is_drawn_only_when_logged():
    assert matching(pixels(plot_training(FALLING)), EVAL_LOSS_COLOUR).sum() == 0
    with_eval = plot_training(FALLING + EVALS)
    assert matching(pixels(with_eval), EVAL_LOSS_COLOUR).sum() > 300
    rows = line_rows(with_eval, EVAL_LOSS_COLOUR)
    assert rows[-1] - rows[0] > 50


def test_mfu_is_drawn_on_the_right_axis_only_when_the_rows_carry_it():
    assert matching(pixels(plot_training(FALLING)), MFU_COLOUR).sum() == 0
    on_gpu = [{**row, "mfu": 0.3 + 0.0005 * row["step"]} for row in FALLING]
    image = pixels(plot_training(on_gpu))
    rows, columns = plot_area(image)
    assert matching(image[rows, columns], MFU_COLOUR).sum() > 200, "a dashed line across the plot"
    rising = line_rows(plot_training(on_gpu), MFU_COLOUR)
    assert rising[0] - rising[-1] > 100, "a rising MFU goes up the screen, on its own axis"


def test_log_scale_bends_a_straight_falling_line():
    """On a log axis a linear fall is steeper at the low end: the second half drops more than the first."""
    rows = line_rows(plot_training(FALLING, log_scale=True), LOSS_COLOUR)
    middle = len(rows) // 2
    assert rows[-1] - rows[middle] > 1.3 * (rows[middle] - rows[0])
    linear = line_rows(plot_training(FALLING), LOSS_COLOUR)
    assert abs((linear[-1] - linear[middle]) - (linear[middle] - linear[0])) < 10


def test_training_plot_without_loss_is_refused():
    with pytest.raises(ValueError, match="no loss"):
        plot_training([{"step": 1, "lr": 1e-3}])


def test_rising_higher_is_better_scores_go_up_the_screen_in_step_order():
    rows = line_rows(plot_benchmark(RISING, "pass@1"), "#1f77b4")
    assert len(rows) > 400
    assert rows[0] - rows[-1] > 200
    assert np.all(np.diff(rows) < 1.0)


def best_star_position(png: bytes) -> tuple[float, float]:
    """Centre of the best-point star inside the frame, as fractions of the frame (0, 0 = top left)."""
    image = pixels(png)
    rows, columns = plot_area(image)
    ys, xs = np.nonzero(matching(image[rows, columns], BEST_COLOUR))
    assert ys.size > 30
    return xs.mean() / (columns.stop - columns.start), ys.mean() / (rows.stop - rows.start)


def test_best_point_is_starred_where_the_direction_says():
    falling_lower = plot_benchmark(BPB, "val_bpb")
    x, y = best_star_position(falling_lower)
    assert x > 0.9 and y > 0.9  # lowest value, last step: bottom right
    falling_higher = [point("val_bpb", p.step, p.value, lower=False) for p in BPB]
    x, y = best_star_position(plot_benchmark(falling_higher, "val_bpb"))
    assert x < 0.1 and y < 0.1  # highest value, first step: top left


def test_benchmark_plot_labels_its_direction_and_draws_a_line_per_series():
    ax = _benchmark_axes(BPB + [point("val_bpb", 50, 2.9, lower=True, stage="sft")] + RISING, "val_bpb")
    assert ax.get_ylabel() == "val_bpb (lower is better)"
    assert ax.get_xlabel() == "step"
    assert [line.get_label() for line in ax.get_lines()] == ["pretrain", "sft", "best: 1.5 at step 300"]
    assert list(ax.get_lines()[0].get_xdata()) == [100, 200, 300]
    assert _benchmark_axes(RISING, "pass@1").get_ylabel() == "pass@1 (higher is better)"


def test_benchmark_points_that_disagree_on_direction_are_refused():
    with pytest.raises(ValueError, match="lower_is_better"):
        plot_benchmark(BPB + [point("val_bpb", 400, 1.0, lower=False)], "val_bpb")


def test_plots_are_the_same_bytes_each_time_whatever_the_row_order():
    assert plot_training(FALLING + EVALS) == plot_training(EVALS + FALLING[1::2] + FALLING[::2])
    assert plot_benchmark(RISING, "pass@1") == plot_benchmark(list(reversed(RISING)), "pass@1")


STAGES = [
    StageCost(kind="tokenizer", digest="b" * 64, cache="hit", seconds=0.0, inputs={"ingest": "a" * 64}),
    StageCost(kind="pretrain", digest="c" * 64, cache="miss", seconds=120.25, inputs={"tokenizer": "b" * 64}),
    StageCost(kind="eval", digest="d" * 64, cache="miss", seconds=3.5, inputs={"pretrain": "c" * 64}),
]
CONTROL = [
    {"step": 150, "rule": "loss_spike", "event": "train_step", "actions": ["rewind", "halve_lr"], "alert": "loss jumped 3x"},
    {"step": 90, "rule": "warmup_done", "event": "eval", "actions": ["evaluate"], "message": "warmup over"},
]
FULL = ReportInputs(
    experiment="tiny-code-lm",
    git_commit="0123456789abcdef",
    body_markdown="# Why\n\nSmall on purpose, `n_layer: 2`.\n\n- **Data.** stdlib\n  and more\n- <script>alert(1)</script>\n",
    config_yaml="model:\n  n_layer: 2\nnote: <b>bold</b>\n",
    training=FALLING + EVALS,
    curves=curves(pretrain=FALLING + EVALS),
    evaluations=BPB + RISING,
    stages=STAGES,
    control=CONTROL,
    links={"tracker run": "http://mlflow.local/#/runs/abc", "evil": "javascript:alert(1)"},
)


def test_report_embeds_one_training_plot_and_one_per_benchmark():
    page = render_report(FULL)
    assert page.count("data:image/png;base64,") == 3
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert base64.b64decode(images[0]) == plot_training(FULL.training)
    assert base64.b64decode(images[1]) == plot_benchmark(FULL.evaluations, "pass@1")
    assert base64.b64decode(images[2]) == plot_benchmark(FULL.evaluations, "val_bpb")


def test_a_benchmark_scored_on_the_experiments_own_held_out_split_says_so_wherever_it_is_shown():
    own = [dataclasses.replace(p, own_split=True) for p in BPB]
    page = render_report(dataclasses.replace(FULL, evaluations=own + RISING))
    assert "<h3>val_bpb (own split) (lower is better)</h3>" in page
    assert "<td>best val_bpb (own split)</td>" in page and "<td>val_bpb (own split)</td>" in page
    assert "<h3>pass@1 (higher is better)</h3>" in page  # scored on shared data: no label
    assert _benchmark_axes(own, "val_bpb").get_title() == "val_bpb (own split)"


def test_report_escapes_every_input_string():
    page = render_report(FULL)
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<b>bold</b>" not in page and "&lt;b&gt;bold&lt;/b&gt;" in page
    assert 'href="javascript:' not in page  # only http(s) values become links
    assert '<a href="http://mlflow.local/#/runs/abc">' in page


def test_report_renders_the_reasoning_as_simple_markdown():
    page = render_report(FULL)
    assert "<h3>Why</h3>" in page
    assert "<p>Small on purpose, <code>n_layer: 2</code>.</p>" in page
    assert "<li><strong>Data.</strong> stdlib and more</li>" in page


def test_report_lists_control_decisions_in_step_order():
    page = render_report(FULL)
    assert page.index("warmup_done") < page.index("loss_spike")
    assert "<td>rewind, halve_lr</td><td>loss jumped 3x</td>" in page


def test_report_totals_stage_cost_and_cache_hits_and_shortens_lineage_digests():
    page = render_report(FULL)
    assert "<td>total</td><td></td><td>1 of 3 hits</td><td class=n>123.8</td>" in page
    assert "<td>pretrain cccccccccccc</td><td>tokenizer</td><td>bbbbbbbbbbbb</td>" in page
    assert "b" * 13 not in page


def test_report_is_the_same_bytes_each_time():
    assert render_report(FULL).encode() == render_report(FULL).encode()


def test_empty_sections_say_none():
    page = render_report(ReportInputs(experiment="fresh", git_commit="abc", curves=curves()))
    assert page.count("<em>none</em>") == 10  # training, sft, rl, benchmarks, evaluations, control, stages, lineage, config, reasoning
    assert "data:image/png" not in page
    assert "<h2>Control decisions</h2>\n<p><em>none</em></p>" in page


def test_a_benchmark_with_no_points_is_refused():
    with pytest.raises(ValueError, match="'nope'"):
        plot_benchmark(BPB, "nope")


RL_ROWS = [{"step": s, "reward_mean": 0.1 + 0.01 * s, "pass_rate": 0.005 * s, "format_rate": 0.9, "kl": 0.001 * s} for s in range(5, 65, 5)]


def test_rl_plot_draws_rising_rewards_and_the_kl():
    image = pixels(plot_rl(RL_ROWS))
    rows = line_rows(plot_rl(RL_ROWS), SERIES_COLOURS[0])  # the mean reward
    assert len(rows) > 300 and rows[0] - rows[-1] > 50  # rising: the right end is higher up the screen
    assert matching(image, EVAL_LOSS_COLOUR).sum() > 100  # the KL curve


def test_report_shows_post_training_only_when_there_was_some():
    page = render_report(dataclasses.replace(FULL, curves=curves(pretrain=FALLING + EVALS, sft=FALLING, rl=RL_ROWS)))
    assert "<h2>Fine-tuning (SFT)</h2>" in page and "<h2>Reinforcement learning</h2>" in page
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert base64.b64decode(images[1]) == plot_training(FALLING) and base64.b64decode(images[2]) == plot_rl(RL_ROWS)
    assert "Reinforcement learning</h2>\n<p><em>none</em>" in render_report(FULL)


def test_a_plugin_kind_with_checkpoints_gets_a_loss_section_under_its_name():
    average = StageKind(name="average", description="", run=lambda ctx: {}, checkpoints=True)
    page = render_report(ReportInputs(experiment="tiny", git_commit="abc", curves=(TrainingCurve(plot=average.metrics_plot(), rows=FALLING),)))
    assert "<h2>average</h2>\n<img alt=\"average loss\"" in page
    assert base64.b64decode(re.findall(r'src="data:image/png;base64,([^"]+)"', page)[0]) == plot_training(FALLING)
    assert StageKind(name="export", description="", run=lambda ctx: {}).metrics_plot() is None  # no checkpoints, no section


def test_a_report_that_differs_in_its_stages_costs_alone_copies_the_plots_of_the_one_before(tmp_path):
    """A rerun's report: the same curves and scores, every stage a cache hit. Its plots are the first report's bytes, read
    from it and not drawn again (its summary says whose they are); a new score draws them again."""
    from factory.evals.run_report import PLOT_FILES, PLOTS_FROM, publish_report
    from factory.registry import ArtifactStore

    registry = ArtifactStore(tmp_path / "registry")
    first = publish_report(registry, FULL)
    hits = [dataclasses.replace(stage, cache="hit", seconds=0.0) for stage in FULL.stages]
    rerun = publish_report(registry, dataclasses.replace(FULL, stages=hits))
    again = publish_report(registry, dataclasses.replace(FULL, stages=hits, control=()))
    assert len({first.digest, rerun.digest, again.digest}) == 3
    assert PLOTS_FROM not in first.summary and rerun.summary[PLOTS_FROM] == again.summary[PLOTS_FROM] == first.digest
    assert first.summary[PLOT_FILES] == rerun.summary[PLOT_FILES] and len(first.summary[PLOT_FILES]) == 3
    assert all(registry.read(rerun, name) == registry.read(first, name) for name in first.summary[PLOT_FILES])
    scored = publish_report(registry, dataclasses.replace(FULL, stages=hits, evaluations=[*FULL.evaluations, point("pass@1", 400, 0.1, lower=False)]))
    assert PLOTS_FROM not in scored.summary
    assert registry.read(scored, "pass@1.png") != registry.read(first, "pass@1.png")

    for report in (first, rerun, again):  # a file gone from every report with those plots: drawn again, not an error
        directory = registry.path(report.digest)
        directory.chmod(0o755)
        (directory / "pass@1.png").unlink()
    drawn = publish_report(registry, dataclasses.replace(FULL, stages=hits, links={}))
    assert PLOTS_FROM not in drawn.summary and registry.read(drawn, "val_bpb.png")
