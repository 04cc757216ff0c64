"""Shared fixtures: the one tiny experiment the docs and the tests share; evaluation results as the evaluator publishes them."""

from pathlib import Path

import pytest

from factory.registry import ArtifactStore

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "experiments" / "tiny-code-lm.md"


@pytest.fixture(scope="session")
def tiny_path() -> Path:
    """The experiment file `make run` uses."""
    return TINY


def publish_result(registry: ArtifactStore, experiment: str, benchmark: str, value: float, step: int = 100, training: str = "run-1",
                   count: int = 64, stage: str = "pretrain") -> None:
    """A score of `experiment`'s checkpoint at `step` (from its training run `training`), published as the evaluator does."""
    from factory.evals.benchmarks import benchmark as registered
    from factory.stages.eval_request import CheckpointRef, EvalItem, EvalRequest, publish_score

    spec = {"kind": stage, "config": {"model": {}, "seed": 0, "stream": {}}, "upstream": {}, "code": training}
    checkpoint = CheckpointRef(key=f"{experiment}__{stage}-{step:06d}", experiment=experiment, step=step, tokens_seen=10 * step,
                               path="unused", sha256=f"{experiment}{step}{training}".ljust(64, "0"), training=spec,
                               eval={"max_bytes": 1000, "batch_size": 8}, git_commit="0" * 40)
    item = EvalItem(partition=f"{benchmark}|{checkpoint.key}", benchmark=benchmark, checkpoint=checkpoint)
    request = EvalRequest(items=(item,), registry=str(registry.root), catalog=None, code="local:test")
    publish_score(registry, request, item, registered(benchmark), value, count, {}, 0.1)


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server (Debian's package) for the session; its URL."""
    from tests.postgres import running_postgres

    with running_postgres() as url:
        yield url
