"""The leaderboard artifact: `latest_leaderboard` shows the newest one even when it was reused."""

from factory.evals.leaderboard import Row
from factory.registry import ArtifactStore
from factory.stages.leaderboard import latest_leaderboard, publish_leaderboard


def row(name: str, bpb: float) -> Row:
    return Row(experiment=name, bpb=bpb, init_bpb=4.0, parameters=10, tokens_seen=100, git_commit="c" * 40, digest=name * 8)


def test_latest_follows_the_last_publish_even_when_it_reuses_an_artifact(tmp_path):
    registry = ArtifactStore(tmp_path)
    assert latest_leaderboard(registry) is None
    first, _ = publish_leaderboard(registry, [row("a", 2.0)], "c" * 40)
    second, _ = publish_leaderboard(registry, [row("b", 1.5)], "c" * 40)
    assert "| b |" in latest_leaderboard(registry) and first.digest != second.digest
    again, _ = publish_leaderboard(registry, [row("a", 2.0)], "c" * 40)
    assert again.digest == first.digest
    assert "| a |" in latest_leaderboard(registry) and "| b |" not in latest_leaderboard(registry)
