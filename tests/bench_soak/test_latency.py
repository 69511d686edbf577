"""Latency per minute by send time; 429s are `rejected`, every other failure `failed`."""
from __future__ import annotations

from raypd.benchmarks.chaos.client import Outcome
from raypd.benchmarks.chaos.driver import Record
from raypd.benchmarks.soak.latency import per_bucket


def rec(start_s: float, ttft: float | None = 0.5, e2e: float | None = 2.0, reason: str | None = None) -> Record:
    return Record(0, 0, start_s, Outcome(reason=reason, ttft_s=ttft, e2e_s=e2e, finish_reason="stop"))


def test_buckets_by_minute_with_percentiles_over_completed_requests():
    records = [rec(1.0, 0.1, 1.0), rec(30.0, 0.3, 3.0), rec(59.9, 0.2, 2.0), rec(61.0, reason="http_429"),
               rec(70.0, reason="timeout"), rec(150.0, 1.0, 4.0)]
    m = per_bucket(records)
    assert [b["minute"] for b in m] == [0, 1, 2] and [b["start_s"] for b in m] == [0.0, 60.0, 120.0]
    assert [(b["requests"], b["ok"], b["failed"], b["rejected"]) for b in m] == [(3, 3, 0, 0), (2, 0, 1, 1),
                                                                               (1, 1, 0, 0)]
    assert m[0]["ttft_p50_s"] == 0.2 and m[0]["e2e_p50_s"] == 2.0 and m[0]["e2e_p99_s"] == 2.98
    assert m[1]["ttft_p50_s"] is None and m[1]["e2e_p99_s"] is None  # nothing completed that minute
    assert m[2]["ttft_p90_s"] == 1.0


def test_an_empty_minute_in_between_is_listed_and_no_requests_no_buckets():
    m = per_bucket([rec(5.0), rec(125.0)])
    assert [(b["minute"], b["requests"]) for b in m] == [(0, 1), (1, 0), (2, 1)]
    assert per_bucket([]) == []
