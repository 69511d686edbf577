"""The run in buckets (benchmarks/autoscale/timeline.py): buckets cut per phase, requests by arrival,
attainment and nodes per bucket; the recovery rule on hand-built buckets (recovers at bucket k, never
dipped, dipped twice, never recovers, no requests) and the cool-down apart."""
from __future__ import annotations

import pytest

from raypd.benchmarks.autoscale.health import HealthSample
from raypd.benchmarks.autoscale.plan import Phase, plan_phases
from raypd.benchmarks.autoscale.records import Record
from raypd.benchmarks.autoscale.timeline import Bucket, bucket_edges, buckets, cool_down, node_counts, recovery
from raypd.benchmarks.serve.metrics import SLO

SLO_ = SLO(ttft_s=1.0, tpot_s=0.1, attainment=0.9)
STEP = Phase("step", start_s=60.0, duration_s=60.0, rate=3.0, seed=1)


def test_buckets_are_cut_from_each_phase_s_own_start():
    plan = plan_phases(1.0, 3.0, warm_s=25.0, step_s=20.0, cool_s=12.0)
    assert bucket_edges(plan, 10.0) == [
        ("warm", 0.0, 10.0), ("warm", 10.0, 20.0), ("warm", 20.0, 25.0),   # the last one shorter
        ("step", 25.0, 35.0), ("step", 35.0, 45.0),
        ("cool", 45.0, 55.0), ("cool", 55.0, 57.0)]
    with pytest.raises(ValueError):
        bucket_edges(plan, 0.0)


def test_requests_fall_in_their_arrival_s_bucket_and_each_bucket_has_its_attainment_rate_and_nodes():
    plan = plan_phases(1.0, 3.0, warm_s=10.0, step_s=10.0, cool_s=10.0)
    met = Record(1.0, "warm", "200", None, 0.5, 0.05)
    slow = Record(12.0, "step", "200", None, 5.0, 0.05)       # its answer ended in a later bucket: no matter
    refused = Record(19.9, "step", "429", "http_429")
    records = [met, Record(9.99, "warm", "200", None, 0.2, None), slow, refused, Record(10.0, "step", "200", None, 0.1, 0.01)]
    samples = [HealthSample(0.5, 200, "ok", {"mixed": {"live": 1}}),
               HealthSample(11.0, 200, "ok", {"mixed": {"live": 1}}, {"roles": {"mixed": {"starting": 1}}}),
               HealthSample(14.0, 200, "ok", {"mixed": {"live": 2, "draining": 1}}),
               HealthSample(25.0, 503, "unavailable", {"mixed": {"live": 1, "dead": 1}})]
    got = buckets(records, plan, samples, SLO_, width_s=5.0)
    assert [(b.phase, b.start_s, b.requests, b.met, b.attainment) for b in got] == [
        ("warm", 0.0, 1, 1, 1.0), ("warm", 5.0, 1, 1, 1.0), ("step", 10.0, 2, 1, 0.5), ("step", 15.0, 1, 0, 0.0),
        ("cool", 20.0, 0, 0, None), ("cool", 25.0, 0, 0, None)]
    assert got[0].offered_rps == 0.2
    assert got[0].nodes == {"mixed": {"live": 1, "draining": 0, "starting": 0}}
    assert got[1].nodes is None and got[3].nodes is None                    # no sample read in them
    assert got[2].nodes == {"mixed": {"live": 2, "draining": 1, "starting": 1}}   # the most of each in the bucket
    assert got[5].nodes == {"mixed": {"live": 1, "draining": 0, "starting": 0}}
    assert got[4].as_json()["nodes"] == {} and got[4].as_json()["attainment"] is None


def test_node_counts_include_a_role_only_the_autoscale_key_names():
    s = HealthSample(0.0, 200, "ok", {"mixed": {"live": 1}}, {"roles": {"decode": {"starting": 2}}})
    assert node_counts([s]) == {"decode": {"live": 0, "draining": 0, "starting": 2},
                                "mixed": {"live": 1, "draining": 0, "starting": 0}}


def step_buckets(attainments: list[float | None], width: float = 10.0) -> list[Bucket]:
    """warm's bucket (below the target: not the step's), then the step's, then cool's (below: not the step's)."""
    out = [Bucket("warm", 50.0, 60.0, 10, 0)]
    for i, a in enumerate(attainments):
        start = STEP.start_s + i * width
        out.append(Bucket("step", start, start + width) if a is None else Bucket("step", start, start + width, 10,
                                                                                   round(10 * a)))
    return out + [Bucket("cool", 120.0, 130.0, 10, 0)]


def test_recovery_is_the_start_of_the_first_bucket_from_which_the_step_stays_at_the_target():
    r = recovery(step_buckets([1.0, 0.5, 0.2, 0.9, 1.0, 0.9]), STEP, 0.9)
    assert (r["dipped"], r["recovered_at_s"], r["recovery_s"], r["never_recovered"]) == (True, 90.0, 30.0, False)
    assert r["buckets_below_target"] == 2 and r["rated_buckets"] == 6


def test_a_dip_after_a_first_recovery_moves_the_recovery_to_after_the_last_dip():
    r = recovery(step_buckets([0.5, 1.0, 0.8, 1.0, None, 1.0]), STEP, 0.9)
    assert (r["recovered_at_s"], r["recovery_s"], r["buckets_below_target"]) == (90.0, 30.0, 2)


def test_a_step_that_never_fell_below_the_target_recovers_at_once():
    r = recovery(step_buckets([0.9, 1.0, None, 1.0]), STEP, 0.9)
    assert (r["dipped"], r["recovered_at_s"], r["recovery_s"]) == (False, 60.0, 0.0)


def test_a_step_still_below_the_target_in_its_last_bucket_never_recovered():
    for attainments in ([1.0, 0.5, 0.2, 0.9, 0.8], [0.5, 0.5, 0.5], [1.0, 0.8, None]):
        r = recovery(step_buckets(attainments), STEP, 0.9)
        assert r["never_recovered"] and r["dipped"] and r["recovery_s"] is None and r["recovered_at_s"] is None


def test_a_step_without_requests_says_nothing():
    r = recovery(step_buckets([None, None]), STEP, 0.9)
    assert r["rated_buckets"] == 0 and not r["dipped"] and not r["never_recovered"] and r["recovery_s"] is None


def test_the_cool_down_is_judged_apart():
    timeline = [Bucket("step", 0, 10, 10, 1), Bucket("cool", 10, 20, 10, 10), Bucket("cool", 20, 30, 10, 8),
                Bucket("cool", 30, 40)]
    assert cool_down(timeline, 0.9) == {"buckets": 2, "buckets_below_target": 1, "lowest_attainment": 0.8}
    assert cool_down([], 0.9) == {"buckets": 0, "buckets_below_target": 0, "lowest_attainment": None}
