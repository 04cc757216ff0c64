"""Shared fixtures: the one tiny experiment the docs and the tests share; evaluation results as the evaluator publishes them."""

import json
from pathlib import Path

import pytest

from factory.registry import ArtifactStore, Provenance

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "experiments" / "tiny-code-lm.md"


@pytest.fixture(scope="session")
def tiny_path() -> Path:
    """The experiment file `make run` uses."""
    return TINY


def publish_result(registry: ArtifactStore, experiment: str, benchmark: str, value: float, step: int = 100) -> None:
    """An evaluation result of `experiment`'s checkpoint at `step`, published as the evaluation process publishes it."""
    checkpoint = f"{experiment}__pretrain-{step:06d}"
    summary = {"benchmark": benchmark, "version": 1, "lower_is_better": benchmark == "val_bpb", "value": value, "count": 64,
               "checkpoint": checkpoint, "experiment": experiment, "step": step, "tokens_seen": 10 * step, "checkpoint_sha256": "0" * 64}
    with registry.staging() as out:
        (out / "result.json").write_text(json.dumps(summary))
        registry.publish(out, kind="evaluations", fingerprint=f"{checkpoint}-{benchmark}", config={}, inputs={}, code="local:test",
                         provenance=Provenance(experiment=experiment, config_hash="c" * 16, git_commit="0" * 40), summary=summary)
