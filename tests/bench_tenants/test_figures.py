"""The arithmetic of `raypd bench tenants` (benchmarks/tenants/figures.py): a stream's figures (TTFT
over accepted requests, a request without a first token as infinite; 429s apart; goodput by the
SLOs), a phase's totals, the ratios against A alone, the shared step's part in A's rise, and the
must-hold verdicts."""
from __future__ import annotations

import math

import pytest

from raypd.benchmarks.serve.client import Result
from raypd.benchmarks.serve.metrics import SLO
from raypd.benchmarks.tenants.figures import comparisons, percentile, ratio, step_effect, stream_figures, total_figures

SLO_ = SLO(ttft_s=1.0, tpot_s=0.1)


def done(ttft: float, e2e: float, tokens: int = 11) -> Result:
    return Result(ttft_s=ttft, e2e_s=e2e, output_tokens=tokens)


def test_percentiles_are_observed_values_and_keep_infinity():
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert percentile([1.0] * 99 + [9.0], 99) == 1.0
    assert percentile([1.0] * 98 + [9.0, math.inf], 99) == 9.0
    assert percentile([1.0] * 98 + [math.inf, math.inf], 99) == math.inf


def test_a_streams_figures():
    results = [done(0.2, 1.2), done(0.4, 1.4), done(2.0, 3.0),       # the last misses the TTFT SLO
               done(0.3, 3.3),                                        # TPOT 0.3: misses the TPOT SLO
               Result(error="http_429", detail="full"), Result(error="http_503", detail="down"),
               Result(error="cancelled", ttft_s=0.5),                 # had its first token when cancelled
               Result(error="cancelled")]                             # never had one: infinite TTFT
    f = stream_figures(results, SLO_, elapsed_s=4.0)
    assert (f["requests"], f["completed"], f["rejected_429"], f["http_5xx"], f["cancelled"]) == (8, 4, 1, 1, 2)
    assert f["without_first_token"] == 2                               # the 503 and the second cancelled
    assert f["errors"] == {"http_429": 1, "http_503": 1, "cancelled": 2}
    assert f["error_examples"] == {"http_503": "down", "http_429": "full"}
    # TTFT over the 7 accepted: 0.2 0.3 0.4 0.5 2.0 inf inf
    assert (f["ttft_p50_s"], f["ttft_p99_s"]) == (0.5, math.inf)
    assert f["tpot_p50_s"] == pytest.approx(0.1)                       # of 0.1, 0.1, 0.1, 0.3
    assert f["slo_met"] == 2 and f["goodput_rps"] == 0.5 and f["throughput_rps"] == 1.0
    assert f["output_tokens_per_s"] == 11.0


def test_a_phases_totals_add_its_streams():
    a = stream_figures([done(0.2, 1.2)], SLO_, 2.0)
    b = stream_figures([done(0.2, 1.2), done(3.0, 4.0), Result(error="http_429")], SLO_, 2.0)
    t = total_figures({"a": a, "b": b}, 2.0)
    assert (t["requests"], t["completed"], t["rejected_429"], t["slo_met"]) == (4, 3, 1, 2)
    assert (t["goodput_rps"], t["throughput_rps"], t["output_tokens_per_s"]) == (1.0, 1.5, 16.5)


def test_ratios():
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None and ratio(1.0, None) is None and ratio(1.0, 0.0) is None
    assert ratio(math.inf, 2.0) == math.inf and ratio(1.0, math.inf) is None


def steps(prefill: float, decode: float) -> dict:
    return {"prefill": {"step_time_mean_s": prefill}, "decode": {"step_time_mean_s": decode}}


def test_the_shared_steps_part_in_as_rise():
    e = step_effect(3.0, steps(0.05, 0.02), steps(0.10, 0.08))       # TTFT 3x, the prefill step 2x
    assert e["step_role"] == "prefill" and e["step_ratio"] == pytest.approx(2.0)
    assert e["decode_step_ratio"] == pytest.approx(4.0)
    assert e["a_ttft_p99_ratio_at_alone_step"] == pytest.approx(1.5)
    assert e["rise_explained_by_step"] == pytest.approx(0.5)          # (2 - 1) / (3 - 1)
    assert step_effect(1.5, steps(0.05, 0.02), steps(0.10, 0.02))["rise_explained_by_step"] == 1.0  # capped
    assert step_effect(0.9, steps(0.05, 0.02), steps(0.10, 0.02))["rise_explained_by_step"] == 1.0  # no rise
    mixed = step_effect(2.0, {"mixed": {"step_time_mean_s": 0.1}}, {"mixed": {"step_time_mean_s": 0.15}})
    assert mixed["step_role"] == "mixed" and mixed["decode_step_ratio"] is None
    unbounded = step_effect(math.inf, steps(0.05, 0.02), steps(0.10, 0.02))
    assert unbounded["a_ttft_p99_ratio_at_alone_step"] is None and unbounded["rise_explained_by_step"] is None
    assert step_effect(2.0, {}, steps(0.1, 0.1))["step_role"] is None


def phase(a_p99: float | None, goodput: float, throughput: float = 1.0) -> dict:
    return {"streams": {"a": {"ttft_p99_s": a_p99}}, "step_times": steps(0.05, 0.02),
            "total": {"goodput_rps": goodput, "throughput_rps": throughput}}


def test_comparisons_against_a_alone_and_the_must_hold_verdicts():
    out, must = comparisons({"a_alone": phase(0.2, 0.5), "flood_fair": phase(0.28, 3.0),
                             "priority": phase(0.4, 2.0), "flood_unfair": phase(math.inf, 2.5)})
    assert out["flood_fair"]["a_ttft_p99_ratio"] == pytest.approx(1.4)
    assert out["priority"]["a_ttft_p99_ratio"] == pytest.approx(2.0)
    assert out["flood_unfair"]["a_ttft_p99_ratio"] == math.inf
    assert out["work_conserving"]["goodput_rps_fair"] == 3.0 and out["work_conserving"]["goodput_rps_unfair"] == 2.5
    assert must == {"a_ttft_p99_fair_at_most_1.5x_alone": True, "high_priority_ttft_p99_at_most_1.5x_alone": False,
                    "total_goodput_fair_not_below_unfair": True}
    _, partial = comparisons({"flood_fair": phase(0.3, 1.0)})       # no alone phase: nothing to judge
    assert set(partial.values()) == {None}
