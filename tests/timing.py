"""The suite's wall time and its slowest modules, printed at the end of every run (a pytest plugin, loaded by
tests/conftest.py): what to look at first when the suite grows slower.

Under pytest-xdist every worker's test reports reach the controller, which adds up each module's setup, call and teardown
durations; a module's seconds are its time on one worker, so their sum exceeds the wall time when workers run side by side.
"""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

SLOWEST = 10


class SuiteTiming:
    """Wall time since the session started, and seconds per module from the reports."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.last_report: dict[str, float] = {}
        """When each worker's last report came (since the start): a worker done long before the others is wall time lost."""

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid.split("::")[0]] += report.duration
        if (node := getattr(report, "node", None)) is not None:  # a worker's report, as xdist hands it to the controller
            self.last_report[node.gateway.id] = time.monotonic() - self.started

    @pytest.hookimpl(trylast=True)  # after pytest's own sections (--durations), just before the final counts
    def pytest_terminal_summary(self, terminalreporter) -> None:
        terminalreporter.write_line(summary(time.monotonic() - self.started, self.seconds, self.last_report))


def summary(wall_s: float, seconds: dict[str, float], finished: dict[str, float] | None = None, slowest: int = SLOWEST) -> str:
    """`suite wall time: M:SS` (under xdist, with when each worker finished its last test), then the `slowest` modules by
    their summed test seconds, slowest first."""
    workers = "".join(f", {worker} done at {clock(at)}" for worker, at in sorted((finished or {}).items(), key=lambda item: item[1]))
    modules = sorted(seconds.items(), key=lambda item: item[1], reverse=True)[:slowest]
    lines = [f"suite wall time: {clock(wall_s)}{workers}", f"slowest {len(modules)} modules (setup, call and teardown summed):"]
    return "\n".join(lines + [f"{module_s:9.1f} s  {module}" for module, module_s in modules])


def clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}:{rest:02d}"


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist): workers print no summary
        config.pluginmanager.register(SuiteTiming(), "suite-timing")
