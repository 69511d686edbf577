"""Growth after the warm-up, exactly: baseline = the first sample at or after the warm-up, end = the
mean of the last samples up to the end of the load; and which processes are compared at all."""
from __future__ import annotations

import pytest

from raypd.benchmarks.soak.growth import alive_through, growth

T = [0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 40.0]


def test_baseline_is_the_first_sample_after_warmup_and_end_the_mean_of_the_tail():
    values = [50, 80, 100, 101, 102, 103, 104, 106, 999]  # 999: after the end of the load (the drain)
    g = growth(T, values, warmup_s=10.0, end_s=35.0, tail=2)
    assert g is not None
    assert (g.baseline_t_s, g.baseline, g.end, g.tail, g.samples) == (10.0, 100.0, 105.0, 2, 6)
    assert g.growth == 5.0 and g.growth_pct == 5.0
    assert (g.window_min, g.window_max) == (100.0, 106.0)


def test_the_tail_is_at_most_half_the_window_and_at_least_one_sample():
    g = growth(T, [10, 10, 10, 10, 10, 10, 10, 12, 14], warmup_s=25.0, end_s=40.0, tail=6)
    assert g is not None and g.samples == 4 and g.tail == 2 and g.end == 13.0 and g.growth_pct == 30.0
    one = growth(T, list(range(9)), warmup_s=40.0, end_s=40.0, tail=3)
    assert one is not None and one.tail == 1 and one.growth == 0.0


def test_a_fall_is_negative_growth_and_a_rise_that_came_back_shows_in_the_max():
    g = growth(T, [10, 10, 10, 30, 10, 10, 10, 8, 8], warmup_s=0.0, end_s=40.0, tail=2)
    assert g is not None and g.growth == -2.0 and g.window_max == 30.0


def test_no_window_no_growth_and_a_zero_baseline_has_no_percentage():
    assert growth(T, list(range(9)), warmup_s=41.0, end_s=50.0, tail=2) is None
    g = growth(T, [0] * 9, warmup_s=0.0, end_s=40.0, tail=2)
    assert g is not None and g.growth_pct is None
    with pytest.raises(ValueError):
        growth(T, list(range(9)), 0.0, 40.0, tail=0)


@pytest.mark.parametrize("times, alive", [
    (T, True),
    ([12.0, 20.0, 30.0, 40.0], True),        # the first sample after the warm-up is within 1.5 periods
    ([20.0, 25.0, 30.0, 40.0], False),       # started after the warm-up
    ([0.0, 5.0, 10.0, 15.0, 20.0], False),   # gone before the end
    ([], False),
])
def test_only_processes_alive_through_the_window_are_compared(times, alive):
    assert alive_through(times, warmup_s=10.0, end_s=40.0, period_s=5.0) is alive
