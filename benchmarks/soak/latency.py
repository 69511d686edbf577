"""Latency over time: the requests of each minute (by when they were sent), with TTFT and E2E
p50 / p90 / p99 over those that completed. Requests answered 429 (admission) count as `rejected`,
every other failure as `failed`.
"""
from __future__ import annotations

from raypd.benchmarks.chaos.driver import Record
from raypd.benchmarks.chaos.report import percentile

REJECTED = "http_429"
QUANTILES = (50, 90, 99)


def is_rejected(rec: Record) -> bool:
    return rec.outcome.reason == REJECTED


def _quantiles(name: str, values: list[float]) -> dict:
    return {f"{name}_p{q}_s": (None if (v := percentile(values, q)) is None else round(v, 4)) for q in QUANTILES}


def per_bucket(records: list[Record], bucket_s: float = 60.0) -> list[dict]:
    """One entry per bucket from the first to the last request sent: minute (the bucket's index),
    start_s, requests, ok, failed, rejected, ttft_p50_s ... e2e_p99_s (null without completed requests)."""
    if not records:
        return []
    buckets: dict[int, list[Record]] = {}
    for r in records:
        buckets.setdefault(int(r.start_s // bucket_s), []).append(r)
    out = []
    for i in range(max(buckets) + 1):
        recs = buckets.get(i, [])
        ok = [r.outcome for r in recs if r.outcome.ok]
        rejected = sum(1 for r in recs if is_rejected(r))
        entry = {"minute": i, "start_s": i * bucket_s, "requests": len(recs), "ok": len(ok),
                 "failed": len(recs) - len(ok) - rejected, "rejected": rejected}
        entry |= _quantiles("ttft", [o.ttft_s for o in ok if o.ttft_s is not None])
        entry |= _quantiles("e2e", [o.e2e_s for o in ok if o.e2e_s is not None])
        out.append(entry)
    return out
