"""When each session starts, in seconds from the start of a run.

    poisson   exponential gaps at `rate` sessions/s (burstiness 1)
    gamma     gamma gaps with shape `burstiness` and the same mean: < 1 burstier, > 1 more regular
    trace     the workload's own timestamps, divided by `time_scale` (2 = twice as fast)
    closed    everything at 0: only --max-concurrency holds requests back (a closed loop)

A request rate is turned into a session rate by dividing by the mean number of requests per
session, so a multiturn workload at 2 req/s starts conversations at 2 / turns per second.
"""
from __future__ import annotations

import math
import random

from raypd.benchmarks.serve.datasets import Workload


def session_starts(workload: Workload, request_rate: float | None, burstiness: float = 1.0, time_scale: float = 1.0,
                   use_timestamps: bool = False, seed: int = 0) -> list[float]:
    n = len(workload.sessions)
    if use_timestamps:
        return [float(s.timestamp_s or 0.0) / time_scale for s in workload.sessions]
    if request_rate is None or math.isinf(request_rate):
        return [0.0] * n
    rate = request_rate * n / max(1, workload.num_requests)
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return out


def native_rate(workload: Workload) -> float:
    """Requests per second of a timed workload's own timestamps (for sweeping it by time scale)."""
    span = max(s.timestamp_s or 0.0 for s in workload.sessions) - min(s.timestamp_s or 0.0 for s in workload.sessions)
    return workload.num_requests / span if span > 0 else math.inf
