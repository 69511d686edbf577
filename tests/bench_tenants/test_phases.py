"""The plan of `raypd bench tenants` (benchmarks/tenants/phases.py): the four phases in the order they
run, which server each needs, who sends what, arrival times, and the flags that make no run."""
from __future__ import annotations

import pytest

from raypd.benchmarks.tenants.phases import PHASES, PlanError, Stream, plan_phases, request_seed


def test_the_four_phases_in_order_with_their_servers_tenants_and_priorities():
    plan = plan_phases(a_rate=0.5, b_rate=8.0, duration_s=60.0, lead_s=5.0)
    assert [p.name for p in plan] == list(PHASES)
    assert [p.fairness for p in plan] == [True, True, True, False]  # one server of each, in this order
    shape = {p.name: [(s.name, s.tenant, s.priority, s.rate, s.arrivals) for s in p.streams] for p in plan}
    assert shape == {
        "a_alone": [("a", "tenant-a", 0, 0.5, "fixed")],
        "flood_fair": [("a", "tenant-a", 0, 0.5, "fixed"), ("b", "tenant-b", 0, 8.0, "poisson")],
        "priority": [("a", "one-tenant", -1, 0.5, "fixed"), ("b", "one-tenant", 0, 8.0, "poisson")],
        "flood_unfair": [("a", "tenant-a", 0, 0.5, "fixed"), ("b", "tenant-b", 0, 8.0, "poisson")]}
    assert plan[0].stream("b") is None


def test_a_sends_on_the_same_schedule_in_every_phase_after_the_lead():
    plan = plan_phases(a_rate=0.5, b_rate=8.0, duration_s=10.0, lead_s=3.0)
    times = [p.stream("a").arrival_times(10.0) for p in plan]  # type: ignore[union-attr]
    assert times[0] == [3.0, 5.0, 7.0, 9.0]                   # a fixed interval from the lead
    assert all(t == times[0] for t in times)
    b = plan[1].stream("b")
    assert b is not None and b.start_s == 0.0


def test_poisson_arrivals_are_seeded_and_inside_the_phase():
    s = Stream("b", "t", 0, 20.0, "poisson", seed=7, start_s=1.0)
    times = s.arrival_times(11.0)
    assert times == s.arrival_times(11.0)
    assert all(1.0 <= t < 11.0 for t in times) and times == sorted(times)
    assert 150 < len(times) < 250                              # 20/s for 10 s
    assert Stream("b", "t", 0, 20.0, "poisson", seed=8, start_s=1.0).arrival_times(11.0) != times
    assert Stream("a", "t", 0, 1.0, "fixed", 0, start_s=5.0).arrival_times(5.0) == []


def test_no_two_phases_or_streams_send_the_same_prompts():
    plan = plan_phases(a_rate=1.0, b_rate=4.0, duration_s=10.0, lead_s=1.0)
    seeds = [request_seed(p, s) for p in plan for s in p.streams]
    assert len(set(seeds)) == len(seeds)


@pytest.mark.parametrize("kwargs, message", [
    ({"a_rate": 0.0}, "rates must be > 0"),
    ({"b_rate": -1.0}, "rates must be > 0"),
    ({"lead_s": 10.0}, "--flood-lead"),
    ({"a_arrivals": "bursty"}, "--a-arrivals"),
    ({"b_rate": 10_000.0}, "would send"),
])
def test_flags_that_make_no_run_are_refused(kwargs, message):
    args = {"a_rate": 1.0, "b_rate": 4.0, "duration_s": 10.0, "lead_s": 1.0} | kwargs
    with pytest.raises(PlanError, match=message):
        plan_phases(**args)
