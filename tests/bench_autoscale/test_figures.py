"""Requests to figures (benchmarks/autoscale/records.py, figures.py): each client error kind's status,
the SLO rule, a phase's figures, and the lost requests: in the cool-down, in all, and among those
open while /health showed a node draining."""
from __future__ import annotations

import pytest

from raypd.benchmarks.autoscale.figures import group_figures, lost_figures, phase_figures
from raypd.benchmarks.autoscale.health import HealthSample
from raypd.benchmarks.autoscale.plan import plan_phases
from raypd.benchmarks.autoscale.records import Record, status_of
from raypd.benchmarks.serve.metrics import SLO

SLO_ = SLO(ttft_s=1.0, tpot_s=0.1)


def ok(at: float, phase: str = "warm", ttft: float = 0.5, tpot: float | None = 0.05, sent: float | None = None,
       end: float | None = None) -> Record:
    sent = at if sent is None else sent
    return Record(at, phase, "200", None, ttft, tpot, sent, sent + 2.0 if end is None else end)


def failed(at: float, error: str, phase: str = "warm", end: float | None = None) -> Record:
    return Record(at, phase, status_of(error), error, None, None, at, at + 0.1 if end is None else end)


@pytest.mark.parametrize("error, status", [
    (None, "200"), ("http_429", "429"), ("http_503", "503"), ("http_500", "other"), ("http_400", "other"),
    ("stream_error", "other"), ("malformed", "other"), ("disconnected", "exception"), ("timeout", "exception"),
    ("connect", "exception"), ("cancelled", "exception"), ("unsent", "exception")])
def test_each_client_error_kind_has_its_status(error, status):
    assert status_of(error) == status


def test_a_request_meets_the_slo_only_when_it_got_200_within_both_targets():
    assert ok(0, ttft=1.0, tpot=0.1).meets(SLO_)                  # at the targets
    assert ok(0, tpot=None).meets(SLO_)                           # one token: no TPOT
    assert not ok(0, ttft=1.01).meets(SLO_)
    assert not ok(0, tpot=0.11).meets(SLO_)
    assert not Record(0, "warm", "200", None, None, None).meets(SLO_)   # no first token seen
    assert not failed(0, "http_429").meets(SLO_)
    assert not ok(0).lost and failed(0, "http_503").lost


def test_a_phase_s_figures_count_every_request_and_take_percentiles_over_the_completed():
    records = [ok(0.0, ttft=0.2, tpot=0.02), ok(1.0, ttft=0.4, tpot=0.04), ok(2.0, ttft=3.0, tpot=0.06),
               failed(3.0, "http_429"), failed(4.0, "http_503"), failed(5.0, "http_500"), failed(6.0, "timeout"),
               failed(7.0, "http_429")]
    f = group_figures(records, SLO_, duration_s=10.0)
    assert (f["requests"], f["completed"], f["met"], f["lost"]) == (8, 3, 2, 5)
    assert f["attainment"] == 2 / 8                                # errors count against it
    assert f["by_status"] == {"200": 3, "429": 2, "503": 1, "other": 1, "exception": 1}
    assert f["errors"] == {"http_429": 2, "http_500": 1, "http_503": 1, "timeout": 1}
    assert (f["ttft_p50_s"], f["ttft_p99_s"]) == (0.4, 3.0)        # nearest rank over the three completed
    assert (f["tpot_p50_s"], f["tpot_p99_s"]) == (0.04, 0.06)
    assert f["offered_rps"] == 0.8
    empty = group_figures([], SLO_, 10.0)
    assert empty["attainment"] is None and empty["ttft_p50_s"] is None and empty["requests"] == 0


def test_phase_figures_split_the_records_by_phase_with_each_phase_s_length():
    plan = plan_phases(1.0, 3.0, 10.0, 20.0, 40.0)
    records = [ok(1.0), ok(12.0, "step"), failed(13.0, "http_429", "step"), ok(31.0, "cool")]
    by_phase = phase_figures(records, plan, SLO_)
    assert {name: (f["requests"], f["met"], f["offered_rps"]) for name, f in by_phase.items()} == {
        "warm": (1, 1, 0.1), "step": (2, 1, 0.1), "cool": (1, 1, 0.025)}


def health(t: float, live: int, draining: int = 0) -> HealthSample:
    return HealthSample(t, 200, "ok", {"mixed": {"live": live, **({"draining": draining} if draining else {})}})


def test_lost_requests_in_the_cool_down_in_all_and_among_those_open_while_a_node_drained():
    samples = [health(100.0, 3), health(101.0, 2, draining=1), health(102.0, 2, draining=1), health(103.0, 2)]
    records = [
        failed(50.0, "http_429", "step"),                       # lost, before any drain
        ok(99.0, "cool", end=100.5),                            # open at 100 only: no drain then
        ok(100.5, "cool", end=101.0),                           # open at 101 (ends exactly then)
        ok(101.5, "cool", end=105.0),                           # open at 102
        failed(101.8, "disconnected", "cool", end=102.5),       # open at 102, lost: a scale-down loss
        failed(102.5, "http_503", "cool", end=102.6),           # lost, but after the last draining sample
        Record(90.0, "cool", "exception", "cancelled", None, None, 90.0, None),  # never ended: open throughout
        Record(104.0, "cool", "exception", "unsent"),           # never sent: open at no time
    ]
    assert lost_figures(records, samples) == {"cool": 4, "total": 5, "open_while_draining": 4,
                                              "lost_open_while_draining": 2}
    assert lost_figures(records, [health(100.0, 3)])["open_while_draining"] == 0
