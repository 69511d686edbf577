"""Statistics of simulated runs, the oracle hit rate for the same cache capacity, and the goodput
sweep (DESIGN.md "Measuring": the highest request rate at which >= 90% of requests meet both SLOs).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from raypd.conductor.sim.cache import BlockLRU
from raypd.conductor.sim.simulator import RunResult
from raypd.conductor.sim.workload import SimRequest


def pct(xs, qs=(50, 90, 99)) -> dict[str, float]:
    if len(xs) == 0:
        return {f"p{q}": float("nan") for q in qs}
    a = np.percentile(np.asarray(xs, dtype=float), qs)
    return {f"p{q}": float(v) for q, v in zip(qs, a)}


def oracle_hit_rate(requests: list[SimRequest], block_size: int, capacity_tokens: int | None) -> float:
    """Hit rate of one pooled LRU cache holding the fleet's total capacity, every request routed
    to it and its blocks cached on arrival: no replica wastes space and no request misses a cached
    prefix because of where it was sent. (capacity None: infinite.) Routing over separate nodes
    cannot beat it except through LRU's own non-optimality, which is small on these traces."""
    cap = capacity_tokens // block_size if capacity_tokens is not None else 1 << 62
    lru = BlockLRU(cap, block_size)
    hit = tot = 0
    for r in sorted(requests, key=lambda r: r.arrival_s):
        hashes = r.block_hashes(block_size)
        hit += lru.match(hashes[:(r.input_len - 1) // block_size]) * block_size
        tot += r.input_len
        lru.insert(hashes, lambda s, e: ())
        r.drop_tokens()
    return hit / tot if tot else 0.0


def summarize(res: RunResult, ttft_slo_s: float, tpot_slo_s: float, span_s: float) -> dict:
    outs = [o for o in res.outcomes if o.finished > 0]
    prompt = sum(o.req.input_len for o in outs)
    cached = sum(o.cached for o in outs)
    fetched = sum(min(o.fetched, o.cached) for o in outs)
    predicted = sum(o.predicted_cached for o in outs)
    ttft = [o.ttft for o in outs]
    tpot = [o.tpot for o in outs if o.tpot is not None]
    met = sum(1 for o in outs if o.ttft <= ttft_slo_s and (o.tpot is None or o.tpot <= tpot_slo_s))
    offered = len(res.outcomes) + res.rejected
    exact = sum(1 for o in outs if o.predicted_cached == o.cached)
    hot = [o.ttft for o in outs if o.req.request_id.startswith("g0-")]
    return {
        "policy": res.policy,
        "requests": offered, "completed": len(outs), "rejected": res.rejected,
        "hit_rate": cached / prompt if prompt else 0.0,
        "hit_rate_local": (cached - fetched) / prompt if prompt else 0.0,
        "hit_rate_fetched": fetched / prompt if prompt else 0.0,
        "predicted_hit_rate": predicted / prompt if prompt else 0.0,
        "prediction_exact_share": exact / len(outs) if outs else 0.0,
        "ttft_s": pct(ttft), "tpot_s": pct(tpot),
        "ttft_s_group0": pct(hot),   # generated workloads: the (hot) prefix group 0
        "e2e_s": pct([o.finished - o.arrival for o in outs]),
        "slo_attainment": met / offered if offered else 0.0,
        "goodput_rps_at_this_rate": met / span_s if span_s > 0 else 0.0,
        "offered_rps": offered / span_s if span_s > 0 else 0.0,
        "load_imbalance_max_over_mean": {"mean": float(np.mean(res.imbalance)) if res.imbalance else 1.0,
                                         **pct(res.imbalance, (50, 90))},
        "prefill_busy_share": res.busy_share,
        "migrations": res.migrations, "fetches": res.fetches, "copy_gbytes": res.copy_bytes / 1e9,
        "branches": res.branches,
        "local_share": sum(o.decode == o.prefill for o in outs) / len(outs) if outs else 0.0,
        "decision_latency_us": {k: v * 1e6 for k, v in pct(res.decision_latency_s).items()},
        "sim_wall_s": res.wall_s,
        **({"duty_orders": res.extra["duty_orders"], "final_duties": res.extra["final_duties"]}
           if "duty_orders" in res.extra else {}),   # +flex: the planner's orders (the last 64) and where it left the nodes
    }


def goodput_sweep(run: Callable[[float], dict], *, start: float = 1.0, target: float = 0.9,
                  max_runs: int = 8, grow: float = 2.0) -> dict:
    """Find the largest time scale (rate multiplier) whose run meets `target` SLO attainment:
    grow geometrically from `start` until a run fails, then bisect. `run(scale)` returns a
    summary (see summarize). Returns the best scale, its summary and every point tried."""
    points: list[tuple[float, dict]] = []

    def attempt(s: float) -> bool:
        summary = run(s)
        points.append((s, summary))
        return summary["slo_attainment"] >= target

    lo, hi = 0.0, None
    s = start
    while len(points) < max_runs:
        if attempt(s):
            lo = s
            if hi is None:
                s *= grow
                continue
        else:
            hi = s
        if hi is None:
            continue
        if lo == 0.0:
            s = hi / grow
            if s < start / 64:
                break
            continue
        if hi / lo < 1.15:
            break
        s = (lo * hi) ** 0.5
    best = max((p for p in points if p[1]["slo_attainment"] >= target), key=lambda p: p[0], default=None)
    return {
        "best_scale": best[0] if best else 0.0,
        "goodput_rps": best[1]["offered_rps"] if best else 0.0,
        "at_best": best[1] if best else None,
        "points": [{"scale": s, "offered_rps": p["offered_rps"], "slo_attainment": p["slo_attainment"],
                    "ttft_p99_s": p["ttft_s"]["p99"], "tpot_p99_s": p["tpot_s"]["p99"],
                    "hit_rate": p["hit_rate"]} for s, p in sorted(points, key=lambda x: x[0])],
    }
