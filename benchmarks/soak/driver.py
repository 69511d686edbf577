"""Open-loop load at a fixed mean rate: request n is sent at the n-th arrival of a seeded Poisson
process (exponential gaps of mean 1 / rate), whatever the server's speed, until the duration has
passed; then the requests in flight finish (the drain). Each is streamed through the official
openai client (benchmarks/chaos/client.py) and becomes one Record (benchmarks/chaos/driver.py).

At most `max_inflight` requests are open at once: an arrival that finds them all open waits for one
to end and is counted in `late` (a server slower than the offered rate shows here, not as an
unbounded pile of connections).
"""
from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from raypd.benchmarks.chaos.client import stream_one
from raypd.benchmarks.chaos.driver import Record
from raypd.benchmarks.chaos.workload import ChaosRequest


def arrival_times(rate: float, duration_s: float, seed: int = 0) -> list[float]:
    """Poisson arrivals in [0, duration_s), seconds from the start."""
    if rate <= 0 or duration_s <= 0:
        raise ValueError("the rate and the duration must be positive")
    rng = random.Random(seed)
    out: list[float] = []
    t = rng.expovariate(rate)
    while t < duration_s:
        out.append(t)
        t += rng.expovariate(rate)
    return out


@dataclass
class OpenLoopResult:
    records: list[Record] = field(default_factory=list)
    late: int = 0               # arrivals that waited for a free slot (max_inflight open)
    load_s: float = 0.0         # from the start until the end of the arrivals' window
    drain_s: float = 0.0        # from the end of the load until the last request ended


class OpenLoop:
    def __init__(self, client, model: str, requests: list[ChaosRequest], rate: float, timeout_s: float,
                 max_inflight: int = 64, seed: int = 0, on_record: Callable[[Record], None] | None = None):
        if max_inflight < 1:
            raise ValueError("max_inflight must be >= 1")
        self.client = client
        self.model = model
        self.requests = requests
        self.rate = rate
        self.timeout_s = timeout_s
        self.max_inflight = max_inflight
        self.seed = seed
        self.on_record = on_record

    async def run(self, duration_s: float, t0: float | None = None, start_at: float = 0.0) -> OpenLoopResult:
        """Send at the arrival times for `duration_s` from `start_at` seconds after `t0`
        (time.perf_counter(); default now); records' send times are from `t0`."""
        t0 = time.perf_counter() if t0 is None else t0
        begin = t0 + start_at
        out = OpenLoopResult()
        slots = asyncio.Semaphore(self.max_inflight)
        tasks: list[asyncio.Task] = []

        async def one(n: int, start: float) -> None:
            try:
                req = self.requests[n % len(self.requests)]
                outcome = await stream_one(self.client, self.model, req, self.timeout_s)
                rec = Record(req.index, n // len(self.requests), start, outcome)
                out.records.append(rec)
                if self.on_record is not None:
                    self.on_record(rec)
            finally:
                slots.release()

        try:
            for n, at in enumerate(arrival_times(self.rate, duration_s, self.seed)):
                await asyncio.sleep(max(0.0, begin + at - time.perf_counter()))
                if slots.locked():
                    out.late += 1
                await slots.acquire()
                tasks.append(asyncio.create_task(one(n, time.perf_counter() - t0)))
            await asyncio.sleep(max(0.0, begin + duration_s - time.perf_counter()))
            out.load_s = time.perf_counter() - begin
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
        out.drain_s = time.perf_counter() - begin - out.load_s
        out.records.sort(key=lambda r: r.start_s)
        return out
