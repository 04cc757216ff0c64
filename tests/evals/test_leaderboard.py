"""The leaderboard: rows ordered by bits per byte, rendered as a Markdown table."""

from factory.evals.leaderboard import Row, build_rows, render_markdown
from factory.registry.store import Manifest


def evaluation(experiment: str, bpb: float, digest: str, commit: str = "0123456789abcdef0123") -> Manifest:
    return Manifest(
        kind="evaluation",
        fingerprint=f"fp-{experiment}",
        digest=digest,
        files={"results.json": {"sha256": "0" * 64, "bytes": 10}},
        config={},
        inputs={"model": "m" * 64},
        code="local:abc",
        experiment=experiment,
        config_hash="c" * 16,
        git_commit=commit,
        created="2025-01-01T00:00:00+00:00",
        summary={"bpb": bpb, "init_bpb": 8.0, "parameters": 123_456, "tokens_seen": 1_000_000},
    )


EVALUATIONS = [
    ("middle", evaluation("middle", 2.5, "b" * 64)),
    ("worst", evaluation("worst", 3.25, "c" * 64)),
    ("best", evaluation("best", 1.75, "a" * 64)),
]


def test_rows_are_ordered_by_lowest_bits_per_byte_first():
    rows = build_rows(EVALUATIONS)
    assert [row.experiment for row in rows] == ["best", "middle", "worst"]
    assert [row.bpb for row in rows] == [1.75, 2.5, 3.25]


def test_ties_are_broken_by_experiment_name():
    rows = build_rows([("zeta", evaluation("zeta", 2.0, "z" * 64)), ("alpha", evaluation("alpha", 2.0, "y" * 64))])
    assert [row.experiment for row in rows] == ["alpha", "zeta"]


def test_rows_carry_the_manifest_summary_and_provenance():
    [best, *_] = build_rows(EVALUATIONS)
    assert best == Row(
        experiment="best",
        bpb=1.75,
        init_bpb=8.0,
        parameters=123_456,
        tokens_seen=1_000_000,
        git_commit="0123456789abcdef0123",
        digest="a" * 64,
    )
    assert best.to_json()["digest"] == "a" * 64
    assert set(best.to_json()) == {"experiment", "bpb", "init_bpb", "parameters", "tokens_seen", "git_commit", "digest"}


def test_markdown_has_a_rank_column_and_one_line_per_experiment_in_order():
    markdown = render_markdown(build_rows(EVALUATIONS))
    header, separator, *lines = markdown.splitlines()
    assert header.startswith("| rank | experiment |")
    assert separator.count("|") == header.count("|")
    assert len(lines) == 3
    for rank, (line, name) in enumerate(zip(lines, ["best", "middle", "worst"], strict=True), start=1):
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert cells[:3] == [str(rank), name, f"{dict(best=1.75, middle=2.5, worst=3.25)[name]:.4f}"]
        assert "123,456" in cells and "1,000,000" in cells
        assert "0123456789ab" in cells


def test_markdown_without_rows_says_so():
    markdown = render_markdown([])
    assert "no evaluations yet" in markdown
    assert markdown.splitlines()[0].startswith("| rank |")
