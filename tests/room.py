"""The room the suite needs in the temporary directory, checked before any test runs (a pytest plugin, loaded by
tests/conftest.py): a disk that fills half way through fails hundreds of tests with `No space left on device`, then
pytest itself, and says nothing of the cause first.
"""

from __future__ import annotations

import shutil
import tempfile

import pytest

NEEDED_BYTES = 2 << 30
"""What a whole run writes under the temporary directory at most, with room to spare: 1.2 GB more than before it started,
at its peak, in a fresh clone (its PostgreSQL clusters, Dagster instances, registries, the tiny pipeline's stores)."""


def problem(directory: str, needed: int) -> str | None:
    """What to do when `directory`'s file system has less than `needed` bytes free; None when it has enough."""
    free = shutil.disk_usage(directory).free
    if free >= needed:
        return None
    return (f"only {free / 2**30:.1f} GiB free in {directory}, and the suite needs {needed / 2**30:.0f} GiB there as it runs: "
            "free some space, or point TMPDIR at a disk that has it, and run it again")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # the controller checks, once
        return
    if (said := problem(tempfile.gettempdir(), NEEDED_BYTES)) is not None:
        pytest.exit(said, returncode=1)
