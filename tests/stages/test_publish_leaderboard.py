"""The leaderboard artifact and the best-model mark: the newest board is found again, marks keep their history."""

from factory.evals.leaderboard import Board, Row
from factory.registry import ArtifactStore
from factory.evals.publish import BEST_REF, current_best, latest_board, mark_best, publish_leaderboard


def board(name: str, bpb: float) -> Board:
    row = Row(experiment=name, checkpoint=f"{name}__pretrain-000010", step=10, tokens_seen=100, scores={"val_bpb": bpb},
              counts={"val_bpb": 1000}, checkpoints_evaluated=1, git_commit="c" * 40, digests={"val_bpb": name * 8})
    return Board(rows=(row,), benchmarks={"val_bpb": True}, sort="val_bpb")


def test_latest_follows_the_last_publish_even_when_it_reuses_an_artifact(tmp_path):
    registry = ArtifactStore(tmp_path)
    assert latest_board(registry) is None
    first, _ = publish_leaderboard(registry, board("a", 2.0), "c" * 40)
    second, markdown = publish_leaderboard(registry, board("b", 1.5), "c" * 40)
    assert latest_board(registry) == board("b", 1.5) and first.digest != second.digest and "| b |" in markdown
    again, _ = publish_leaderboard(registry, board("a", 2.0), "c" * 40)
    assert again.digest == first.digest
    assert latest_board(registry) == board("a", 2.0)
    assert (registry.path(again.digest) / "leaderboard.html").read_text().startswith("<!doctype html>")


def test_marking_a_best_model_moves_the_ref_and_keeps_the_previous_mark(tmp_path):
    registry = ArtifactStore(tmp_path)
    assert current_best(registry) is None
    first = mark_best(registry, board("a", 2.0).rows[0], "c" * 40)
    second = mark_best(registry, board("b", 1.5).rows[0], "c" * 40)
    assert current_best(registry) == board("b", 1.5).rows[0]
    assert registry.ref(BEST_REF) == second.digest and registry.path(first.digest).is_dir()
