"""Concurrent load: `concurrency` workers take the next request of the list in turn and stream it
(client.py), until a stop condition says no more; requests in flight then finish (the drain).

    reference run   each request once:                       stop when the next index reaches len(list)
    chaos run       the list again and again, cycle by cycle: stop when the clock passes the end

Every request sent is one Record: which request (index into the list) of which cycle, when it was
sent (seconds from the run's start), and its Outcome.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from raypd.benchmarks.chaos.client import Outcome, stream_one
from raypd.benchmarks.chaos.workload import ChaosRequest


@dataclass(frozen=True, slots=True)
class Record:
    index: int
    cycle: int
    start_s: float
    outcome: Outcome


class Load:
    def __init__(self, client, model: str, requests: list[ChaosRequest], concurrency: int, timeout_s: float,
                 on_record: Callable[[Record], None] | None = None):
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.client = client
        self.model = model
        self.requests = requests
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.on_record = on_record

    async def run(self, keep_going: Callable[[int], bool]) -> list[Record]:
        """Send request n = 0, 1, 2, ... (list[n % len], cycle n // len) while keep_going(n); wait for all."""
        records: list[Record] = []
        counter = iter(range(1 << 62))
        t0 = time.perf_counter()

        async def worker() -> None:
            while keep_going(n := next(counter)):
                req = self.requests[n % len(self.requests)]
                start = time.perf_counter() - t0
                outcome = await stream_one(self.client, self.model, req, self.timeout_s)
                rec = Record(req.index, n // len(self.requests), start, outcome)
                records.append(rec)
                if self.on_record is not None:
                    self.on_record(rec)

        await asyncio.gather(*(worker() for _ in range(self.concurrency)))
        return records

    async def once(self) -> list[Record]:
        return await self.run(lambda n: n < len(self.requests))

    async def until(self, deadline: float) -> list[Record]:
        """Cycle through the list until time.monotonic() passes `deadline`; in-flight requests finish."""
        return await self.run(lambda n: time.monotonic() < deadline)
