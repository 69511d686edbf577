"""Goodput by sweeping the request rate: the highest rate at which at least the target share of
requests meets the SLOs.

With explicit rates, they run in increasing order and the sweep stops at the first that misses
(higher rates would only miss more, and each costs minutes). Without them: from `start`, double
while the rate passes (halve while it misses), then `refine` geometric bisections between the
highest pass and the lowest miss; at most `max_steps` runs in all. Each run's `step` number seeds
its workload, so a step does not find the previous step's prompts in the cache. Halving stops
below `min_rate` (a run at rate r lasts about requests / r seconds).
"""
from __future__ import annotations

import math
from collections.abc import Callable


def sweep(measure: Callable[[float, int], dict], target: float, rates: list[float] | None = None,
          start: float = 1.0, max_steps: int = 6, refine: int = 1, min_rate: float = 0.0) -> tuple[float, list[dict]]:
    """(goodput in requests/s, 0 if no rate passed; every step's summary in the order run)."""
    steps: list[dict] = []

    def run(rate: float) -> bool:
        s = measure(rate, len(steps))
        s["rate"] = rate
        s["passed"] = s["slo_attainment"] >= target
        steps.append(s)
        return bool(s["passed"])

    if rates:
        for r in sorted(rates):
            if not run(r):
                break
    else:
        lo, hi, r = 0.0, math.inf, start
        while len(steps) < max_steps and (lo == 0.0 or math.isinf(hi)):
            if run(r):
                lo = r
                r = r * 2
            else:
                hi = r
                r = r / 2
                if r < min_rate:  # each halving doubles a step's duration: give up below min_rate
                    break
            if lo and not math.isinf(hi):
                break
        for _ in range(refine):
            if len(steps) >= max_steps or not lo or math.isinf(hi):
                break
            mid = math.sqrt(lo * hi)
            if run(mid):
                lo = mid
            else:
                hi = mid
    passed = [s["rate"] for s in steps if s["passed"]]
    return (max(passed) if passed else 0.0), steps
