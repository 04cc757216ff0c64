"""The training progress bar: drawn when the launcher says stderr is a terminal, absent otherwise."""

import io

from factory.launch.local import PROGRESS_ENV
from factory.runtime.progress import training_progress, wants_progress


def test_the_bar_shows_step_loss_and_throughput():
    screen = io.StringIO()
    with training_progress("pretrain", 10, enabled=True, file=screen) as update:
        for step in range(1, 11):
            update(step, 2.0 / step, 12_345.0)
    drawn = screen.getvalue()
    assert "pretrain" in drawn and "10/10" in drawn
    assert "loss 0.2000" in drawn and "12,345 tok/s" in drawn
    assert "\x1b[" in drawn  # drawn for a terminal


def test_no_bar_unless_asked_and_never_for_several_ranks(monkeypatch):
    with training_progress("pretrain", 10, enabled=False) as update:
        assert update is None
    monkeypatch.setenv(PROGRESS_ENV, "1")
    assert wants_progress(1) and not wants_progress(2)
    monkeypatch.setenv(PROGRESS_ENV, "0")
    assert not wants_progress(1)
