"""The load step's plan (benchmarks/autoscale/plan.py): warm, step and cool back to back at the base
rate, the step's and the base rate again, each phase's Poisson arrivals from its own seeded RNG (so
exact), and the plans that make no run."""
from __future__ import annotations

import random

import pytest

from raypd.benchmarks.autoscale.plan import MAX_REQUESTS, PHASES, Phase, PlanError, phase_at, plan_phases, schedule


def poisson(seed: int, rate: float, start: float, end: float) -> list[float]:
    """The reference: exponential gaps of mean 1/rate from `start`, drawn from random.Random(seed)."""
    rng, out = random.Random(seed), []
    t = start + rng.expovariate(rate)
    while t < end:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def test_three_phases_back_to_back_at_the_base_the_step_and_the_base_again():
    plan = plan_phases(base_rate=0.5, step_factor=3.0, warm_s=60.0, step_s=120.0, cool_s=240.0, seed=7)
    assert [(p.name, p.start_s, p.duration_s, p.rate, p.seed) for p in plan] == [
        ("warm", 0.0, 60.0, 0.5, 7000), ("step", 60.0, 120.0, 1.5, 7001), ("cool", 180.0, 240.0, 0.5, 7002)]
    assert tuple(p.name for p in plan) == PHASES
    assert plan[-1].end_s == 420.0


def test_each_phase_draws_its_arrivals_from_its_own_seeded_rng_exactly():
    plan = plan_phases(base_rate=2.0, step_factor=3.0, warm_s=10.0, step_s=20.0, cool_s=30.0, seed=3)
    for p in plan:
        assert p.arrival_times() == poisson(p.seed, p.rate, p.start_s, p.end_s)
    counts = [len(p.arrival_times()) for p in plan]
    assert counts == [len(poisson(3000, 2.0, 0, 10)), len(poisson(3001, 6.0, 10, 30)), len(poisson(3002, 2.0, 30, 60))]
    # A phase's schedule does not depend on the other phases' lengths or rates.
    other = plan_phases(base_rate=2.0, step_factor=5.0, warm_s=10.0, step_s=5.0, cool_s=30.0, seed=3)
    assert other[0].arrival_times() == plan[0].arrival_times()


def test_the_schedule_is_every_arrival_in_time_order_with_its_phase():
    plan = plan_phases(base_rate=1.0, step_factor=3.0, warm_s=5.0, step_s=5.0, cool_s=5.0, seed=0)
    arrivals = schedule(plan)
    assert [a.at_s for a in arrivals] == sorted(a.at_s for a in arrivals)
    assert [a.at_s for a in arrivals] == [t for p in plan for t in p.arrival_times()]
    assert all(phase_at(plan, a.at_s) == a.phase for a in arrivals)
    assert phase_at(plan, 5.0) == "step" and phase_at(plan, 15.0) is None and phase_at(plan, -1.0) is None


def test_a_phase_sends_within_its_own_window_only():
    p = Phase("step", start_s=10.0, duration_s=0.5, rate=0.001, seed=1)
    assert all(10.0 <= t < 10.5 for t in p.arrival_times())


@pytest.mark.parametrize("kwargs, message", [
    ({"base_rate": 0.0}, "base rate must be > 0"),
    ({"step_factor": 1.0}, "--step-factor"),
    ({"cool_s": 0.0}, "--warm, --step and --cool"),
    ({"base_rate": 100.0, "step_s": 600.0}, f"at most {MAX_REQUESTS}"),
])
def test_plans_that_make_no_run_are_refused(kwargs, message):
    args = {"base_rate": 1.0, "step_factor": 3.0, "warm_s": 10.0, "step_s": 10.0, "cool_s": 10.0} | kwargs
    with pytest.raises(PlanError, match=message):
        plan_phases(**args)
