"""The load step's open loop: request i is sent at its arrival time whatever the server does,
streamed and timed by bench serve's client (benchmarks/serve/client.py), and its end time noted (so
the report can tell which requests were open while a node drained).

At most `max_inflight` requests are open at once: an arrival that finds them all open waits for one
and is counted `late`; one still waiting when the arrivals' window ends is not sent (`unsent`, a
lost request of status exception). After the arrivals, `finish()` waits, bounded, for the open
requests and `cancel_open()` ends the rest (error `cancelled`, closing the connection aborts it on
the server).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

from raypd.benchmarks.autoscale.plan import Arrival
from raypd.benchmarks.autoscale.records import Record, from_result, unsent
from raypd.benchmarks.serve.client import Result, send
from raypd.benchmarks.serve.datasets import Request

CANCELLED = "cancelled"


@dataclass(frozen=True)
class _Sent:
    arrival: Arrival
    result: Result        # filled as the request goes, so a cancelled one keeps what it measured
    task: asyncio.Task


class OpenLoop:
    def __init__(self, http: aiohttp.ClientSession, base_url: str, model: str, requests: list[Request],
                 timeout_s: float, max_inflight: int):
        if max_inflight < 1:
            raise ValueError("max_inflight must be >= 1")
        self.http = http
        self.base_url = base_url
        self.model = model
        self.requests = requests
        self.timeout_s = timeout_s
        self.slots = asyncio.Semaphore(max_inflight)
        self.late = 0
        self._sent: list[_Sent] = []
        self._ends: dict[int, float] = {}   # index in _sent -> when it ended, from t0
        self._unsent: list[Arrival] = []

    async def send_all(self, arrivals: list[Arrival], t0: float, until_s: float) -> None:
        """Send request i at t0 + arrivals[i].at_s (time.perf_counter()); returns once the last is sent.
        An arrival still waiting for a slot at t0 + until_s is not sent, nor any after it."""
        if len(arrivals) > len(self.requests):
            raise ValueError(f"{len(arrivals)} arrivals but {len(self.requests)} requests")
        for i, (req, arrival) in enumerate(zip(self.requests, arrivals)):
            await asyncio.sleep(max(0.0, t0 + arrival.at_s - time.perf_counter()))
            if self.slots.locked():
                self.late += 1
            try:
                await asyncio.wait_for(self.slots.acquire(), max(0.0, t0 + until_s - time.perf_counter()))
            except asyncio.TimeoutError:
                self._unsent = arrivals[i:]
                return
            res = Result(max_tokens=req.max_tokens)
            self._sent.append(_Sent(arrival, res, asyncio.create_task(self._one(req, t0, res, len(self._sent)))))

    async def _one(self, req: Request, t0: float, res: Result, index: int) -> None:
        try:
            await send(self.http, self.base_url, req, self.model, {}, self.timeout_s, t0, None, res)
        finally:
            self._ends[index] = time.perf_counter() - t0
            self.slots.release()

    def open_count(self) -> int:
        return sum(1 for s in self._sent if not s.task.done())

    async def finish(self, timeout_s: float) -> None:
        """Wait until every request sent has ended, at most `timeout_s`."""
        open_tasks = [s.task for s in self._sent if not s.task.done()]
        if open_tasks:
            await asyncio.wait(open_tasks, timeout=timeout_s)

    async def cancel_open(self) -> int:
        """End every request still open; how many were."""
        open_tasks = [s.task for s in self._sent if not s.task.done()]
        for t in open_tasks:
            t.cancel()
        await asyncio.gather(*open_tasks, return_exceptions=True)
        return len(open_tasks)

    def records(self) -> list[Record]:
        """One Record per arrival, sent or not, in arrival order (call after cancel_open)."""
        out = []
        for i, s in enumerate(self._sent):
            if s.task.cancelled():
                s.result.error, s.result.detail = CANCELLED, "still open when the run's drain ended"
            out.append(from_result(s.arrival.at_s, s.arrival.phase, s.result, self._ends.get(i)))
        return out + [unsent(a.at_s, a.phase) for a in self._unsent]
