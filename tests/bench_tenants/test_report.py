"""The report of `raypd bench tenants` (benchmarks/tenants/report.py): JSON without infinities (an
unbounded percentile is null and a note says why) and a table naming every phase, the comparisons
and the must-hold checks."""
from __future__ import annotations

import json
import math

from raypd.benchmarks.serve.client import Result
from raypd.benchmarks.serve.metrics import SLO
from raypd.benchmarks.tenants.figures import comparisons, stream_figures, total_figures
from raypd.benchmarks.tenants.phases import PHASES
from raypd.benchmarks.tenants.report import finite, format_table, unbounded_notes, write_json


def phase(fairness: bool, a: list[Result], b: list[Result] | None) -> dict:
    slo = SLO(2.0, 0.25)
    streams = {"a": stream_figures(a, slo, 10.0)} | ({"b": stream_figures(b, slo, 10.0)} if b is not None else {})
    return {"fairness": fairness, "elapsed_s": 10.0, "streams": streams, "total": total_figures(streams, 10.0),
            "step_times": {"prefill": {"step_time_mean_s": 0.02, "running_mean": 1.0, "samples": 5},
                           "decode": {"step_time_mean_s": 0.01, "running_mean": 3.0, "samples": 5}},
            "held_after": {"total": 0, "idle": True}}


def report() -> dict:
    ok = Result(ttft_s=0.1, e2e_s=1.0, output_tokens=10)
    phases = {"a_alone": phase(True, [ok], None), "flood_fair": phase(True, [ok], [ok, Result(error="http_429")]),
              "priority": phase(True, [ok], [ok]),
              "flood_unfair": phase(False, [ok, Result(error="cancelled")], [ok])}
    comparison, must = comparisons(phases)
    return {"config": {}, "capacity": {"rps": 2.0, "measured": True}, "phases": phases, "comparison": comparison,
            "must_hold": must, "servers": [], "notes": unbounded_notes(phases)}


def test_the_json_has_no_infinity_and_a_note_says_what_is_unbounded(tmp_path):
    r = report()
    assert r["phases"]["flood_unfair"]["streams"]["a"]["ttft_p99_s"] == math.inf
    assert r["notes"] == ["flood_unfair: 1 of stream a's accepted requests got no first token within the phase "
                          "(cancelled at its end or failed); its TTFT p99 is unbounded (null)"]
    write_json(tmp_path / "r.json", r)
    back = json.loads((tmp_path / "r.json").read_text(), parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert back["phases"]["flood_unfair"]["streams"]["a"]["ttft_p99_s"] is None
    assert back["comparison"]["flood_unfair"]["a_ttft_p99_ratio"] is None
    assert finite({"x": [math.inf, 1.0], "y": -math.inf}) == {"x": [None, 1.0], "y": None}


def test_the_table_names_every_phase_the_comparisons_and_the_checks():
    table = format_table(report())
    for name in PHASES:
        assert f"\n{name} " in table
    assert "flood_fair: A's TTFT p99 1.00x alone; prefill step 1.00x alone (decode 1.00x)" in table
    assert "flood_unfair: A's TTFT p99 inf alone" in table
    assert "total goodput with fairness" in table
    assert "must hold: a_ttft_p99_fair_at_most_1.5x_alone: yes" in table
    assert "note: flood_unfair: 1 of stream a's" in table
