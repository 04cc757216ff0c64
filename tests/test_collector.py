"""The cycle collector paused for a bulk read (factory/collector.py)."""

import gc

import pytest

from factory.collector import collector_paused


def test_the_collector_paused_for_a_read_runs_again_after_it_even_when_the_read_fails_and_stays_off_where_it_was():
    with pytest.raises(ZeroDivisionError):
        with collector_paused():
            with collector_paused():  # a read inside another: the outer one turns it back on
                assert not gc.isenabled()
            assert not gc.isenabled()
            1 / 0
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # it was off before: it stays off
    finally:
        gc.enable()
