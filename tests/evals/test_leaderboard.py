"""The leaderboard: each experiment at the model it exported (an unfinished run marked, never ranked), ranked by the primary
benchmark; regressions found."""

import dataclasses
import json
import math
import re

import pytest

from factory.errors import ConfigError
from factory.evals.leaderboard import (
    Board, Row, Runs, build_board, entries_of, held_back, latest_results, leader, merge, model_cell, regressions, render_html, render_markdown,
)
from factory.evals import publish
from factory.evals.publish import current_board
from factory.registry import ArtifactStore
from tests.conftest import publish_model, publish_result
from factory.registry.store import Manifest

LOWER = {"val_bpb": True, "next_line": False, "heldout_bpb": True}
SHARED_BLEND = "blend:1111111111111111+aaaaaaaa"


def result(experiment: str, step: int, benchmark: str, value: float, created: str = "2026-01-01T00:00:00+00:00", version: int = 1,
           training: str = "", count: int = 64, data: str = SHARED_BLEND, primary: str = "") -> Manifest:
    checkpoint = f"{experiment}__pretrain-{step:06d}"
    training = training or f"{experiment}-run-1"
    return Manifest(
        kind="evaluations", fingerprint=f"fp-{checkpoint}-{benchmark}-{created}", digest=f"d-{checkpoint}-{benchmark}-{value}",
        files={"result.json": {"sha256": "0" * 64, "bytes": 10}}, config={}, inputs={}, code="local:abc", experiment=experiment,
        config_hash="c" * 16, git_commit="0123456789abcdef0123", created=created,
        summary={"benchmark": benchmark, "version": version, "lower_is_better": LOWER[benchmark], "value": value, "count": count,
                 "checkpoint": checkpoint, "experiment": experiment, "step": step, "tokens_seen": step * 100, "training": training,
                 "data": data, **({"primary": primary} if primary else {})},
    )


def finished(results: list[Manifest]) -> Runs:
    """Every training run of `results` finished at its last evaluated step, and a model stage exported it."""
    steps: dict[str, int] = {}
    for m in (m for m in results if "training" in m.summary and "step" in m.summary):
        steps[m.summary["training"]] = max(steps.get(m.summary["training"], 0), m.summary["step"])
    return Runs(exported={training: f"model-of-{training}".ljust(64, "0") for training in steps}, steps=steps)


def build(results: list[Manifest], **options) -> Board:
    """The board of `results` whose runs all finished."""
    return build_board(results, finished(results), **options)


RESULTS = [
    result("a", 100, "val_bpb", 2.5), result("a", 100, "next_line", 0.10),
    result("a", 200, "val_bpb", 2.2), result("a", 200, "next_line", 0.05),  # a's best by val_bpb, though worse on next_line
    result("b", 100, "val_bpb", 2.0), result("b", 100, "next_line", 0.30),
    result("c", 300, "val_bpb", 3.0),
]


def test_each_experiment_is_shown_at_the_checkpoint_it_exported_with_that_checkpoints_scores():
    board = build(RESULTS)
    assert [row.experiment for row in board.rows] == ["b", "a", "c"]
    a = board.rows[1]
    assert (a.checkpoint, a.step, a.tokens_seen, a.checkpoints_evaluated) == ("a__pretrain-000200", 200, 20_000, 2)
    assert dict(a.scores) == {"val_bpb": 2.2, "next_line": 0.05}  # one model per row, never the best of each column
    assert board.benchmarks == {"val_bpb": True, "next_line": False} and board.sort == "val_bpb"


def test_sorting_by_a_higher_is_better_benchmark_puts_the_highest_first_and_rows_without_it_last():
    board = build(RESULTS, sort="next_line")
    assert [row.experiment for row in board.rows] == ["b", "a", "c"]
    assert [row.scores.get("next_line") for row in board.rows] == [0.30, 0.05, None]
    assert build(RESULTS, sort="next_line") == board


def test_sorting_by_a_benchmark_without_results_says_which_have_results():
    with pytest.raises(ConfigError, match="no results for benchmark 'nope'.*next_line, val_bpb"):
        build(RESULTS, sort="nope")


def test_a_newer_result_for_the_same_checkpoint_and_benchmark_supersedes_the_older():
    newer = result("c", 300, "val_bpb", 1.0, created="2026-02-01T00:00:00+00:00")
    assert [m.summary["value"] for m in latest_results([RESULTS[-1], newer])] == [1.0]
    assert build([*RESULTS, newer]).rows[0].experiment == "c"


def test_a_retrained_experiment_is_shown_from_its_newest_training_run_only():
    retrained = [result("a", 100, "val_bpb", 2.4, created="2026-02-01T00:00:00+00:00", training="run-2")]  # no step 200 this time
    board = build([*RESULTS, *retrained])
    a = next(row for row in board.rows if row.experiment == "a")
    assert (a.checkpoint, dict(a.scores)) == ("a__pretrain-000100", {"val_bpb": 2.4})  # not run-1's step 200, not a mix


def test_only_the_newest_version_of_a_benchmark_is_compared():
    newer = result("c", 300, "val_bpb", 9.0, version=2)
    board = build([*RESULTS, newer])
    assert [row.experiment for row in board.rows] == ["c", "a", "b"]  # a and b have no v2 score: ranked after
    assert board.rows[1].scores.get("val_bpb") is None


def test_regressions_beyond_the_tolerance_are_named_with_both_scores_and_small_ones_pass():
    board = build(RESULTS)
    b, a = board.rows[0], board.rows[1]
    assert regressions(b, a, board.benchmarks) == []  # b is better on both
    found = regressions(a, b, board.benchmarks)
    assert len(found) == 2 and found[0].startswith("next_line: 0.0500 vs 0.3000") and "higher is better" in found[0]
    assert "0.1146 is allowed" in found[0]  # two standard errors of a share of 64 items at 0.30
    slightly = build([result("x", 1, "val_bpb", 2.03), result("y", 1, "val_bpb", 2.0)])
    x, y = sorted(slightly.rows, key=lambda row: row.experiment)
    assert regressions(x, y, slightly.benchmarks, tolerance=0.02) == []
    assert regressions(x, y, slightly.benchmarks, tolerance=0.01) != []


def test_a_share_of_few_items_may_drop_within_its_noise():
    few = build([result("x", 1, "next_line", 0.05, count=10), result("y", 1, "next_line", 0.30, count=10)])
    x, y = sorted(few.rows, key=lambda row: row.experiment)
    assert regressions(x, y, few.benchmarks) == []  # 0.25 below, but 2 standard errors of 10 items at 0.30 are 0.29


def test_markdown_has_a_column_per_benchmark_and_a_line_per_experiment_in_rank_order():
    header, separator, *lines = render_markdown(build(RESULTS)).splitlines()
    assert "next_line (own split) ↑" in header and "val_bpb (own split) ↓" in header
    assert separator.count("|") == header.count("|")
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    assert [row[1] for row in cells] == ["b", "a", "c"]
    assert cells[2][2] == "model-of-c-r" and cells[2][3] == "c__pretrain-000300"  # the model's digest as the CLI prints it
    assert cells[2][4] == "–" and cells[2][5] == "3.0000"  # c has no next_line score


def test_the_html_page_escapes_names_and_carries_the_board_as_json():
    board = build([result("<script>x</script>", 1, "val_bpb", 2.0)])
    page = render_html(board)
    assert "<script>x</script>" not in page and "&lt;script&gt;" in page
    data = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S).group(1)
    import html
    assert Board.from_json(json.loads(html.unescape(data))) == board


def test_an_empty_board_says_so():
    board = build([])
    assert board.rows == () and "no evaluations yet" in render_markdown(board) and "no evaluations yet" in render_html(board)


TOY_BLEND, CODE_BLEND = "blend:2222222222222222+bbbbbbbb", "blend:3333333333333333+cccccccc"
HELDOUT = "eval.heldout_code@v1#content-0123456789abcdef"
LATER = "2026-03-01T00:00:00+00:00"
# The issue: a 40-step toy scored on its own notes has a lower val_bpb than tiny-code-lm on its own held-out split.
TOY = [result("toy", 40, "val_bpb", 1.2, data=TOY_BLEND, created=LATER), result("toy", 40, "heldout_bpb", 3.1, data=HELDOUT)]
TINY = [
    result("tiny", 200, "val_bpb", 1.9, data=CODE_BLEND), result("tiny", 200, "heldout_bpb", 2.6, data=HELDOUT),
    result("tiny", 300, "val_bpb", 2.0, data=CODE_BLEND), result("tiny", 300, "heldout_bpb", 2.3, data=HELDOUT),  # best on heldout
]


def test_own_split_scores_of_experiments_with_other_blends_are_not_ranked_against_each_other():
    board = build([m for m in [*TOY, *TINY] if m.summary["benchmark"] == "val_bpb"])
    assert board.sort == "val_bpb" and board.data["val_bpb"] == TOY_BLEND  # one experiment each: the newest results rank
    toy, tiny = board.rows
    assert (toy.experiment, toy.ranked, tiny.experiment, tiny.ranked) == ("toy", True, "tiny", False)
    assert tiny.note == "val_bpb on its own held-out split (blend 33333333…), not comparable with the ranked rows' " \
                        "(its own held-out split (blend 22222222…))"


def test_heldout_bpb_ranks_experiments_of_any_blend_each_at_its_exported_checkpoint():
    board = build([*TOY, *TINY])
    assert board.sort == "heldout_bpb" and board.data["heldout_bpb"] == HELDOUT
    assert [(row.experiment, row.checkpoint, row.ranked) for row in board.rows] == [
        ("tiny", "tiny__pretrain-000300", True), ("toy", "toy__pretrain-000040", True),  # tiny at 300: the final checkpoint
    ]
    assert dict(board.rows[0].data) == {"heldout_bpb": HELDOUT, "val_bpb": CODE_BLEND}
    assert board.rows[0].versions == {"heldout_bpb": 1, "val_bpb": 1}


def test_sorting_by_an_own_split_benchmark_ranks_only_the_rows_on_the_same_split():
    other = [result("sweep", 100, "val_bpb", 1.95, data=CODE_BLEND), result("sweep", 100, "heldout_bpb", 2.4, data=HELDOUT)]
    board = build([*TOY, *TINY, *other], sort="val_bpb")
    assert board.data["val_bpb"] == CODE_BLEND  # two experiments on this split, one on the toy's
    assert [(row.experiment, row.ranked) for row in board.rows] == [("sweep", True), ("tiny", True), ("toy", False)]


def test_regressions_compare_only_scores_on_the_same_data():
    board = build([*TOY, *TINY])
    tiny, toy = board.rows
    assert regressions(tiny, toy, board.benchmarks) == []  # val_bpb 2.0 vs 1.2 is not a regression: other held-out splits
    assert regressions(toy, tiny, board.benchmarks)[0].startswith("heldout_bpb: 3.1000 vs 2.3000")
    same_split = build([result("x", 1, "val_bpb", 2.0), result("y", 1, "val_bpb", 1.2)])
    x, y = same_split.rows[1], same_split.rows[0]
    assert regressions(x, y, same_split.benchmarks) != []  # on the same split it is one


def test_a_leader_on_an_own_split_the_best_was_not_scored_on_is_held_back():
    only_own_split = build([m for m in [*TOY, *TINY] if m.summary["benchmark"] == "val_bpb"])
    toy, tiny = only_own_split.rows
    [reason] = held_back(toy, tiny, only_own_split)
    assert reason.startswith("toy leads on val_bpb measured on its own held-out split (blend 22222222…), which the current best tiny")
    shared = build([*TOY, *TINY])
    assert held_back(shared.rows[0], shared.rows[1], shared) == []  # tiny leads on heldout_bpb and regresses nowhere comparable
    assert held_back(shared.rows[1], shared.rows[0], shared) != []  # the toy is worse on heldout_bpb


def test_results_from_before_data_was_recorded_compare_only_with_their_own_experiment():
    old = [dataclasses.replace(m, summary={k: v for k, v in m.summary.items() if k != "data"})  # copies: RESULTS is shared
           for m in RESULTS if m.summary["experiment"] in ("a", "b")]
    board = build(old)
    assert [row.ranked for row in board.rows] == [True, False]
    assert "unrecorded data" in board.rows[1].note
    a = next(row for row in board.rows if row.experiment == "a")
    assert a.checkpoint == "a__pretrain-000200"  # within one experiment its own results still compare


def test_renders_mark_own_split_columns_and_scores_not_comparable_with_their_column():
    board = build([*TOY, *TINY])
    markdown = render_markdown(board)
    header, _, tiny, toy, _, legend = markdown.splitlines()
    assert "heldout_bpb ↓" in header and "val_bpb (own split) ↓" in header
    assert board.data["val_bpb"] == CODE_BLEND  # one experiment on each split: the column of the higher-placed row's
    assert tiny.startswith("| 1 | tiny | model-of-tin | tiny__pretrain-000300 | 2.3000 | 2.0000 |")
    assert toy.startswith("| 2 | toy | model-of-toy | toy__pretrain-000040 | 3.1000 | 1.2000* |")
    assert legend.startswith("* measured on other data than the rest of its column")
    page = render_html(board)
    assert "val_bpb (own split) ↓" in page and 'class="nc" title="measured on its own held-out split (blend 22222222…)"' in page
    unranked = build([m for m in [*TOY, *TINY] if m.summary["benchmark"] == "val_bpb"])
    assert render_markdown(unranked).splitlines()[3].startswith("| – | tiny |")
    assert Board.from_json(json.loads(json.dumps(board.to_json()))) == board
    assert all(list(row.to_json()) == list(Row.__slots__) for row in board.rows)  # every field, none twice


def test_a_board_published_before_data_was_recorded_still_reads():
    board = Board.from_json({"sort": "val_bpb", "benchmarks": {"val_bpb": True}, "rows": [
        {"experiment": "a", "checkpoint": "a__pretrain-000100", "step": 100, "tokens_seen": 1, "scores": {"val_bpb": 2.0},
         "counts": {"val_bpb": 10}, "checkpoints_evaluated": 1, "git_commit": "0" * 40, "tracker_url": "", "digests": {}},
    ]})
    assert board.rows[0].ranked and board.rows[0].scored_on("val_bpb") == "unrecorded:a"
    assert "2.0000 |" in render_markdown(board)


def test_a_result_whose_summary_lacks_keys_is_skipped_with_a_warning_naming_it(caplog):
    broken = dataclasses.replace(result("z", 100, "val_bpb", 1.0), fingerprint="fp-broken", summary={"benchmark": "val_bpb", "value": "low"})
    board = build([*RESULTS, broken])
    assert [row.experiment for row in board.rows] == ["b", "a", "c"]
    assert "fp-broken" in caplog.text and "experiment" in caplog.text


def test_the_row_is_the_checkpoint_the_model_stage_exported_even_when_an_earlier_one_scores_better():
    results = [result("a", 100, "heldout_bpb", 2.0, data="eval.heldout_code@v1#content-0"),
               result("a", 200, "heldout_bpb", 2.4, data="eval.heldout_code@v1#content-0")]
    [row] = build(results).rows
    assert (row.checkpoint, row.scores["heldout_bpb"], row.model, row.finished) == ("a__pretrain-000200", 2.4, "model-of-a-run-1".ljust(64, "0"), True)


def test_an_interrupted_run_is_marked_unfinished_never_ranked_and_never_the_leader():
    done = [result("done", 300, "val_bpb", 2.0)]
    cut = [result("cut", 100, "val_bpb", 1.5), result("cut", 200, "val_bpb", 1.4)]  # better, but its run exported no model
    board = build_board([*done, *cut], finished(done))
    assert [(row.experiment, row.ranked, row.finished) for row in board.rows] == [("done", True, True), ("cut", False, False)]
    cut_row = board.rows[1]
    assert cut_row.checkpoint == "cut__pretrain-000200" and cut_row.note.startswith("unfinished: its pretrain run exported no model")
    assert model_cell(cut_row) == "unfinished" and "| – | cut | unfinished |" in render_markdown(board)
    assert leader(board).experiment == "done"
    only_cut = build_board(cut, finished(done))
    assert leader(only_cut) is None  # nothing to mark best
    stopped_early = Runs(exported=finished(cut).exported, steps={"cut-run-1": 300})  # the final checkpoint (300) is not scored yet
    assert not build_board(cut, stopped_early).rows[0].finished


def test_the_board_ranks_by_the_primary_most_experiment_files_name_unless_asked_for_another():
    results = [
        result("notes", 100, "val_bpb", 1.0, data=TOY_BLEND, primary="val_bpb"), result("notes", 100, "heldout_bpb", 3.0, data=HELDOUT, primary="val_bpb"),
        result("more", 100, "val_bpb", 1.5, data=TOY_BLEND, primary="val_bpb"), result("more", 100, "heldout_bpb", 2.0, data=HELDOUT, primary="val_bpb"),
        result("code", 100, "val_bpb", 1.2, data=CODE_BLEND), result("code", 100, "heldout_bpb", 2.5, data=HELDOUT),  # no eval.primary
    ]
    board = build(results)
    assert board.sort == "val_bpb" and [(row.experiment, row.ranked) for row in board.rows] == [("notes", True), ("more", True), ("code", False)]
    assert build(results, sort="heldout_bpb").rows[0].experiment == "more"
    assert build(results[4:]).sort == "heldout_bpb"  # a file without one: heldout_bpb


def test_the_current_board_reads_which_runs_finished_and_what_they_exported_from_the_registry(tmp_path):
    registry = ArtifactStore(tmp_path)
    for step in (100, 200):
        publish_result(registry, "done", "val_bpb", 2.0 + step / 1000, step=step)
        publish_result(registry, "cut", "val_bpb", 1.0, step=step, training="run-2")
    model = publish_model(registry, "done", step=200)
    board = current_board(registry)
    done, cut = board.rows
    assert (done.experiment, done.checkpoint, done.model, done.ranked) == ("done", "done__pretrain-000200", model, True)
    assert (cut.experiment, cut.finished, cut.ranked) == ("cut", False, False)


def test_the_primary_an_experiment_file_names_is_recorded_with_its_scores_and_ranks_the_current_board(tmp_path):
    registry = ArtifactStore(tmp_path)
    for name, blend, own, shared in (("notes", "e" * 64, 1.0, 3.0), ("more", "e" * 64, 1.5, 2.0)):
        publish_result(registry, name, "val_bpb", own, blend=blend, training=name, primary="val_bpb")
        publish_result(registry, name, "heldout_bpb", shared, blend=blend, training=name, primary="val_bpb")
        publish_model(registry, name, blend=blend, training=name)
    assert {m.summary["primary"] for m in registry.manifests("evaluations")} == {"val_bpb"}
    board = current_board(registry)
    assert board.sort == "val_bpb" and [row.experiment for row in board.rows] == ["notes", "more"]
    assert [row.experiment for row in current_board(registry, "heldout_bpb").rows] == ["more", "notes"]


def test_the_current_board_is_kept_until_a_manifest_is_published_or_removed(tmp_path, caplog):
    registry = ArtifactStore(tmp_path)
    publish_result(registry, "done", "val_bpb", 2.0, step=100)
    publish_model(registry, "done", step=100)
    first = current_board(registry)
    [kept] = [path for path in (tmp_path / "cache" / "boards").iterdir() if not path.name.startswith("entries-")]
    state, saved = publish._kept(kept, None, dict)
    assert saved == first.to_json()
    # what is kept is what is given while the registry is unchanged (a board written there by hand shows that)
    publish._keep(kept, state, {**saved, "rows": []})
    assert current_board(registry).rows == ()
    publish_result(registry, "late", "val_bpb", 1.0, step=100, training="run-2")  # a new manifest: computed again
    assert [row.experiment for row in current_board(registry).rows] == ["done", "late"]
    [manifest] = [m for m in registry.manifests("evaluations") if m.experiment == "late"]
    registry.manifest_path(manifest.fingerprint).unlink()  # one removed: computed again
    assert [row.experiment for row in current_board(registry).rows] == ["done"]
    kept.write_text("{not json")
    assert [row.experiment for row in current_board(registry).rows] == ["done"]
    assert "the kept leaderboard" in caplog.text
    assert current_board(registry, "val_bpb").to_json() == current_board(registry).to_json()  # kept per sort
    assert len([path for path in (tmp_path / "cache" / "boards").iterdir() if not path.name.startswith("entries-")]) == 2


def test_a_board_marshal_cannot_write_is_given_and_not_kept(tmp_path):
    class Name(str):  # a str of a type of its own (a caller's enum, say): marshal refuses it, JSON wrote it as a str
        pass

    registry = ArtifactStore(tmp_path)
    publish_result(registry, "done", "val_bpb", 2.0, step=100)
    publish_model(registry, "done", step=100)
    board = current_board(registry, Name("val_bpb"))
    assert board.sort == "val_bpb" and [row.experiment for row in board.rows] == ["done"]
    assert all(path.name.startswith("entries-") for path in (tmp_path / "cache" / "boards").iterdir()), "the board is not kept"
    assert current_board(registry, "val_bpb").to_json() == board.to_json()


def test_a_score_that_is_not_a_number_ranks_after_the_others_whatever_order_the_entries_come_in():
    results = [result("a", 100, "val_bpb", math.nan), result("b", 100, "val_bpb", 2.0), result("c", 100, "val_bpb", 1.0),
               result("d", 100, "val_bpb", math.inf)]
    entries = list(entries_of(results, finished(results), {}, {}).values())
    for order in (entries, entries[::-1], entries[1:] + entries[:1]):
        assert [row.experiment for row in merge(order).rows] == ["c", "b", "a", "d"]
