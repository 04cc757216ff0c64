"""Shared fixtures: the one tiny experiment the docs and the tests share."""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "experiments" / "tiny-code-lm.md"


@pytest.fixture(scope="session")
def tiny_path() -> Path:
    """The experiment file `make run` uses."""
    return TINY
