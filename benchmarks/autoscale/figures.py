"""From the request records to each phase's figures and to the lost requests.

Per phase (and over the whole run): requests, completed (200), met (records.py's rule), attainment
= met / requests (every request counts, errors included: DESIGN.md "Measuring"), requests by status
(200, 429, 503, other, exception) and by the client's error kind, TTFT and TPOT p50/p99 over the
completed requests (nearest rank: an observed value), and the offered rate = requests / the phase's
length.

Lost: every request that is not 200, in the cool-down (where the pool shrinks: "scale-down loses no
request" needs 0 there) and over the run; and among the requests open while some node was draining
(sent at or before a /health sample that showed a draining node, and ended at or after it, or never),
how many there were and how many of them were lost.
"""
from __future__ import annotations

from collections import Counter

from raypd.benchmarks.autoscale.health import HealthSample
from raypd.benchmarks.autoscale.plan import Phase
from raypd.benchmarks.autoscale.records import STATUSES, Record
from raypd.benchmarks.serve.metrics import SLO
from raypd.benchmarks.tenants.figures import percentile


def group_figures(records: list[Record], slo: SLO, duration_s: float) -> dict:
    done = [r for r in records if r.status == "200"]
    ttfts = [r.ttft_s for r in done if r.ttft_s is not None]
    tpots = [r.tpot_s for r in done if r.tpot_s is not None]
    met = sum(1 for r in records if r.meets(slo))
    by_status = Counter(r.status for r in records)
    return {"requests": len(records), "completed": len(done), "met": met,
            "attainment": met / len(records) if records else None,
            "by_status": {s: by_status.get(s, 0) for s in STATUSES},
            "errors": dict(sorted(Counter(r.error for r in records if r.error).items())),
            "lost": len(records) - len(done),
            "ttft_p50_s": percentile(ttfts, 50), "ttft_p99_s": percentile(ttfts, 99),
            "tpot_p50_s": percentile(tpots, 50), "tpot_p99_s": percentile(tpots, 99),
            "offered_rps": len(records) / duration_s if duration_s > 0 else None}


def phase_figures(records: list[Record], phases: list[Phase], slo: SLO) -> dict[str, dict]:
    return {p.name: group_figures([r for r in records if r.phase == p.name], slo, p.duration_s) for p in phases}


def draining_times(samples: list[HealthSample]) -> list[float]:
    """The times of the samples that showed at least one draining node."""
    return [s.t_s for s in samples if any(states.get("draining", 0) for states in s.roles.values())]


def open_at(r: Record, t_s: float) -> bool:
    return r.sent_s is not None and r.sent_s <= t_s and (r.end_s is None or r.end_s >= t_s)


def lost_figures(records: list[Record], samples: list[HealthSample]) -> dict:
    drains = draining_times(samples)
    during = [r for r in records if any(open_at(r, t) for t in drains)]
    return {"cool": sum(1 for r in records if r.phase == "cool" and r.lost),
            "total": sum(1 for r in records if r.lost),
            "open_while_draining": len(during),
            "lost_open_while_draining": sum(1 for r in during if r.lost)}
