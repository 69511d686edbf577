"""The pool's size over the run from /health samples (benchmarks/autoscale/pool.py): its history in
the rows where it changed, and per role when it grew after the step began and when it was back at
its minimum after the cool-down began."""
from __future__ import annotations

from raypd.benchmarks.autoscale.health import HealthSample
from raypd.benchmarks.autoscale.plan import plan_phases
from raypd.benchmarks.autoscale.pool import at_min, changes, scaling

WARM, STEP, COOL = plan_phases(1.0, 3.0, warm_s=10.0, step_s=20.0, cool_s=30.0)


def s(t: float, live: int, draining: int = 0, starting: int | None = None) -> HealthSample:
    states = {"live": live, **({"draining": draining} if draining else {})}
    auto = None if starting is None else {"roles": {"mixed": {"starting": starting}}}
    return HealthSample(t, 200, "ok", {"mixed": states}, auto)


# 1 node until the step, a second live at +6 s (starting from +2 s), a third at +14 s; in the cool-down
# one drains from +5 s and is gone at +8 s, the next drains at +20 s, gone at +23 s.
RUN = [s(0, 1), s(9, 1), s(12, 1, starting=1), s(16, 2), s(24, 3), s(30, 3), s(35, 2, draining=1), s(38, 2),
       s(50, 1, draining=1), s(53, 1), s(59, 1)]


def test_the_history_keeps_the_first_sample_and_every_change():
    assert [(c["t_s"], c["roles"]["mixed"]) for c in changes(RUN)] == [
        (0, {"live": 1, "draining": 0, "starting": 0}), (12, {"live": 1, "draining": 0, "starting": 1}),
        (16, {"live": 2, "draining": 0, "starting": 0}), (24, {"live": 3, "draining": 0, "starting": 0}),
        (35, {"live": 2, "draining": 1, "starting": 0}), (38, {"live": 2, "draining": 0, "starting": 0}),
        (50, {"live": 1, "draining": 1, "starting": 0}), (53, {"live": 1, "draining": 0, "starting": 0})]
    assert changes([]) == []


def test_growth_from_the_step_s_start_and_shrinking_from_the_cool_down_s():
    assert scaling(RUN, STEP, COOL, {"mixed": 1}) == {"mixed": {
        "least": 1, "at_step_start": 1, "first_up_s": 6, "peak_live": 3, "peak_s": 14, "first_drain_s": 5,
        "back_to_min_s": 23, "live_at_end": 1}}


def test_a_pool_that_never_moved_and_one_that_never_came_back():
    flat = [s(0, 1), s(15, 1), s(40, 1)]
    assert scaling(flat, STEP, COOL, {"mixed": 1})["mixed"] == {   # times: the first sample from each start
        "least": 1, "at_step_start": 1, "first_up_s": None, "peak_live": 1, "peak_s": 5, "first_drain_s": None,
        "back_to_min_s": 10, "live_at_end": 1}
    stuck = [s(0, 1), s(20, 3), s(45, 3)]
    got = scaling(stuck, STEP, COOL, {})["mixed"]       # no minimum given: the count at the step's start
    assert (got["least"], got["first_up_s"], got["back_to_min_s"], got["live_at_end"]) == (1, 10, None, 3)


def test_the_pool_is_at_its_minimum_only_with_nothing_draining_or_starting():
    assert at_min(s(0, 1), {"mixed": 1})
    assert not at_min(s(0, 2), {"mixed": 1})
    assert not at_min(s(0, 1, draining=1), {"mixed": 1})
    assert not at_min(s(0, 1, starting=1), {"mixed": 1})
    assert not at_min(s(0, 1), {"mixed": 1, "decode": 1})
