"""The report (benchmarks/autoscale/report.py) of a hand-built load step (report_fixture.py): phases,
timeline, recovery, scaling, lost requests and the must-hold verdicts, the JSON written without
infinities and read back, and the summary's lines."""
from __future__ import annotations

import json

from raypd.benchmarks.autoscale.report import after_peak, format_summary, must_hold
from raypd.benchmarks.tenants.report import write_json
from tests.bench_autoscale.report_fixture import report

# The step's first two buckets (20-40 s) miss the SLO, then it holds.
RECOVERS = set(range(20, 40))


def test_a_step_that_recovers_and_a_scale_down_that_loses_nothing():
    r = report(RECOVERS)
    assert list(r["phases"]) == ["warm", "step", "cool"]
    assert [(f["requests"], f["met"]) for f in r["phases"].values()] == [(20, 20), (120, 60), (60, 60)]
    assert r["total"]["requests"] == 200 and r["total"]["lost"] == 0
    assert [(b["phase"], b["start_s"], b["attainment"]) for b in r["timeline"]][1:5] == [
        ("warm", 10.0, 1.0), ("step", 20.0, 0.0), ("step", 30.0, 0.0), ("step", 40.0, 1.0)]
    assert r["timeline"][2]["nodes"] == {"mixed": {"live": 1, "draining": 0, "starting": 1}}
    assert r["timeline"][3]["nodes"] == {"mixed": {"live": 2, "draining": 0, "starting": 0}}
    assert r["timeline"][7]["nodes"] == {"mixed": {"live": 3, "draining": 1, "starting": 0}}   # 70-80 s
    assert (r["recovery"]["recovery_s"], r["recovery"]["dipped"]) == (20.0, True)
    assert r["recovery"]["after_peak_s"] == -5.0          # back at +20 s, the third node live at +25 s
    assert r["scaling"]["mixed"] == {"least": 1, "at_step_start": 1, "first_up_s": 10.0, "peak_live": 3,
                                     "peak_s": 25.0, "first_drain_s": 15.0, "back_to_min_s": 40.0, "live_at_end": 1}
    assert r["lost"] == {"cool": 0, "total": 0, "open_while_draining": 12, "lost_open_while_draining": 0}
    assert r["must_hold"] == {"scaled_up": True, "recovered_within_30s": True, "scale_down_lost_none": True,
                              "scaled_back_to_min": True}
    assert [c["t_s"] for c in r["pool_changes"]] == [0, 25, 30, 45, 75, 80, 95, 100]
    assert r["autoscale_orders"] == [{"role": "mixed", "delta": 1, "reason": "ttft", "at": 5.0}]
    assert r["health"]["autoscale_key_seen"] and len(r["health"]["samples"]) == 121
    assert r["requests"]["columns"][:3] == ["at_s", "phase", "status"] and len(r["requests"]["rows"]) == 200
    assert r["calibration"] == {"capacity": None, "base_rate_rps": 1.0, "step_rate_rps": 3.0, "base_rate_given": True}
    assert r["notes"] == []


def test_a_step_that_never_recovers_and_a_scale_down_that_loses_requests():
    r = report(set(range(20, 60)), lost={77, 90})
    assert r["recovery"]["never_recovered"] and r["recovery"]["recovery_s"] is None
    assert r["recovery"]["after_peak_s"] is None
    # Open while a node drained (75-79 s, 95-99 s): the requests sent from a second before each.
    assert r["lost"] == {"cool": 2, "total": 2, "open_while_draining": 12, "lost_open_while_draining": 1}
    assert r["must_hold"] == {"scaled_up": True, "recovered_within_30s": False, "scale_down_lost_none": False,
                              "scaled_back_to_min": True}
    assert r["phases"]["cool"]["by_status"] == {"200": 58, "429": 0, "503": 2, "other": 0, "exception": 0}
    assert any("never recovered" in n for n in r["notes"])


def test_a_recovery_later_than_the_stated_time_fails_its_must_hold():
    assert report(set(range(20, 50)))["must_hold"]["recovered_within_30s"]       # back at 50 s: 30 s in
    assert report(set(range(20, 50)), recover_within_s=29.0)["must_hold"] == {
        "scaled_up": True, "recovered_within_29s": False, "scale_down_lost_none": True, "scaled_back_to_min": True}


def test_verdicts_the_run_cannot_give_are_null():
    flat = {"mixed": {"peak_live": 1, "peak_s": 0, "at_step_start": 1, "first_drain_s": None, "live_at_end": 1,
                      "back_to_min_s": 0}}
    nothing = {"rated_buckets": 0, "recovery_s": None}
    lost = {"cool": 0, "lost_open_while_draining": 0}
    assert must_hold(nothing, flat, lost, 60.0) == {"scaled_up": False, "recovered_within_60s": None,
                                                    "scale_down_lost_none": None, "scaled_back_to_min": None}
    assert must_hold(nothing, {}, lost, 60.0)["scaled_up"] is None
    assert after_peak(10.0, flat) is None and after_peak(None, {"mixed": {"peak_s": 3, "peak_live": 2,
                                                                        "at_step_start": 1}}) is None


def test_the_json_round_trips_and_the_summary_names_every_phase_and_verdict(tmp_path):
    r = report(RECOVERS)
    path = tmp_path / "out" / "autoscale.json"
    write_json(path, r)
    back = json.loads(path.read_text())
    assert back["must_hold"] == r["must_hold"] and back["timeline"] == r["timeline"]
    text = format_summary(r)
    for line in ("\nwarm ", "\nstep ", "\ncool ", "recovery: 20 s after the step began, -5 s from the pool's peak",
                 "scaling mixed: 1 -> peak 3 live", "lost: 0 in the cool-down", "must hold: scaled_up: yes",
                 "must hold: recovered_within_30s: yes"):
        assert line in text, line
    assert "never: attainment still below" in format_summary(report(set(range(20, 60))))
