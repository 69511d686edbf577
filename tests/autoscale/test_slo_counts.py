"""SLO counts from the ingress to the pool: they add up, a refusal is a TTFT miss, a tally starts over
at each report, and the pool's window keeps what arrived within it and after the last change."""
from __future__ import annotations

import pickle

import pytest

from raypd.cluster.autoscale.slo_counts import SloCounts, SloTally, SloWindow


def test_counts_add_up_from_zero():
    a, b = SloCounts(3, 4, 2, 3, 1), SloCounts(5, 6, 4, 4, 2)
    assert a + b == SloCounts(8, 10, 6, 7, 3)
    assert sum([a, b], SloCounts.ZERO) == a + b
    assert SloCounts.ZERO + a == a and SloCounts.ZERO == SloCounts()


def test_a_refused_request_is_a_ttft_miss():
    c = SloCounts(ttft_met=6, ttft_total=8, tpot_met=7, tpot_total=8, rejected=2)
    assert c.samples == 10
    assert c.ttft_attainment == 0.6             # 6 met of 8 served + 2 refused
    assert c.tpot_attainment == 7 / 8           # refusals have no TPOT
    assert SloCounts(rejected=3).ttft_attainment == 0.0 and SloCounts(rejected=3).tpot_attainment is None
    assert SloCounts.ZERO.ttft_attainment is None and SloCounts.ZERO.samples == 0
    assert c.to_dict() == {"ttft_met": 6, "ttft_total": 8, "tpot_met": 7, "tpot_total": 8, "rejected": 2,
                           "ttft_attainment": 0.6, "tpot_attainment": 0.875}


@pytest.mark.parametrize("fields", [(3, 2, 0, 0, 0), (0, 0, 2, 1, 0), (0, 0, 0, 0, -1), (-1, 0, 0, 0, 0)])
def test_counts_that_cannot_be_are_refused(fields):
    with pytest.raises(ValueError, match="inconsistent SLO counts"):
        SloCounts(*fields)


def test_counts_cross_a_process_boundary_as_they_are():
    c = SloCounts(1, 2, 3, 4, 5)
    assert pickle.loads(pickle.dumps(c)) == c


def test_a_tally_counts_each_request_against_its_targets_and_starts_over_at_each_take():
    tally = SloTally(ttft_target_s=1.0, tpot_target_s=0.1)
    tally.observe(0.5, 0.05)
    tally.observe(1.0, 0.1)             # exactly at the target: met
    tally.observe(1.5, 0.2)
    tally.observe(0.2, None)            # one output token: no TPOT
    tally.observe(None, None)           # failed before its first token (not for capacity): not counted
    tally.observe(9.0, 9.0, rejected=True)
    assert tally.take() == SloCounts(ttft_met=3, ttft_total=4, tpot_met=2, tpot_total=3, rejected=1)
    assert tally.take() == SloCounts.ZERO
    tally.observe(2.0, 0.05)
    assert tally.take() == SloCounts(0, 1, 1, 1, 0)


def test_a_tally_needs_targets():
    with pytest.raises(ValueError, match="SLO targets must be > 0"):
        SloTally(0.0, 0.1)


def test_the_window_sums_what_arrived_within_it_and_drops_what_is_older():
    window = SloWindow(window_s=30.0)
    window.add(0.0, SloCounts(1, 1, 0, 0, 0))
    window.add(10.0, SloCounts(0, 1, 0, 0, 0))
    window.add(20.0, SloCounts(0, 0, 0, 0, 1))
    assert window.over(29.0) == SloCounts(1, 2, 0, 0, 1)
    assert window.over(30.0) == SloCounts(0, 1, 0, 0, 1)        # (0, 30]: the report at 0 is out
    assert window.over(15.0) == SloCounts(0, 1, 0, 0, 0)        # pruned for good, whatever is asked later
    assert window.over(50.0) == SloCounts.ZERO


def test_the_window_counts_only_what_arrived_after_the_last_change():
    window = SloWindow(window_s=30.0)
    for at in (2.0, 4.0, 6.0, 8.0):
        window.add(at, SloCounts(0, 5, 0, 0, 0))
    assert window.over(8.0, since=4.0) == SloCounts(0, 10, 0, 0, 0)     # 6 and 8; the report at 4 is before
    assert window.over(8.0) == SloCounts(0, 20, 0, 0, 0)                 # the counts are kept for status


def test_a_window_needs_a_length():
    with pytest.raises(ValueError, match="window_s must be > 0"):
        SloWindow(0.0)
