"""The nodes' step times as `raypd bench tenants` reads them (benchmarks/tenants/step_times.py): per
role, the steps between a phase's first and last read and their mean wall time, from the nodes'
cumulative counters (a restarted node counts from its restart), and the batch sizes seen while busy."""
from __future__ import annotations

import pytest

from raypd.benchmarks.tenants.step_times import StepSampler


def answer(*nodes: tuple[str, str, int, float, int]) -> dict:
    return {"nodes": [{"name": name, "role": role, "held": {},
                       "load": {"steps": steps, "step_s_total": total, "running": running, "step_time_s": 9.9}}
                      for name, role, steps, total, running in nodes]}


def test_each_roles_steps_in_the_window_and_their_mean():
    s = StepSampler(http=None, base="http://127.0.0.1:1")  # type: ignore[arg-type]  # observe() reads nothing
    s.observe(answer(("p0", "prefill", 100, 50.0, 0), ("d0", "decode", 1000, 30.0, 0)))
    s.observe(answer(("p0", "prefill", 101, 50.5, 1), ("d0", "decode", 1200, 36.0, 4)))
    s.observe({"nodes": [{"name": "x", "error": "ActorDiedError"}]})             # no load: skipped
    s.observe("not an answer")
    s.observe(answer(("p0", "prefill", 103, 51.1, 0), ("d0", "decode", 1400, 44.0, 8),
                     ("d1", "decode", 10, 0.5, 2)))                               # d1 appears: counts from here
    s.observe(answer(("p0", "prefill", 103, 51.1, 0), ("d0", "decode", 1400, 44.0, 0),
                     ("d1", "decode", 3, 0.3, 0)))                                # d1 restarted: from its restart
    summary = s.summary()
    assert summary["prefill"] == {"steps": 3, "step_time_mean_s": pytest.approx(1.1 / 3), "running_mean": 1.0}
    assert summary["decode"] == {"steps": 400, "step_time_mean_s": pytest.approx(0.035), "running_mean": 14 / 3}


def test_a_role_that_did_not_step_has_no_mean():
    s = StepSampler(http=None, base="http://127.0.0.1:1")  # type: ignore[arg-type]
    s.observe(answer(("p0", "prefill", 5, 1.0, 0)))
    s.observe(answer(("p0", "prefill", 5, 1.0, 0)))
    assert s.summary() == {"prefill": {"steps": 0, "step_time_mean_s": None, "running_mean": None}}
