"""One stream's open-loop traffic in one phase: request i is sent at its arrival time whatever the
server does, as tenant `stream.tenant` (the x-raypd-tenant header) with `stream.priority` in the
body, streamed and timed by bench serve's client (benchmarks/serve/client.py). At most
`max_inflight` are open at once; an arrival that finds them all open waits for one and is counted
`late` (the client's own bound, so a flood cannot open connections without limit); one still waiting
when the phase's arrivals end is not sent (`unsent`).

The phase decides when a stream ends (run.py): `finish()` waits, bounded, for its open requests;
`cancel_open()` ends the rest. A cancelled request is recorded with the error `cancelled` (closing
its connection aborts it on the nodes), with the TTFT it had reached, if any.
"""
from __future__ import annotations

import asyncio
import time

import aiohttp

from raypd.benchmarks.serve.client import Result, send
from raypd.benchmarks.serve.datasets import Request
from raypd.benchmarks.tenants.phases import Stream
from raypd.cluster.openai.guard import TENANT_HEADER

CANCELLED = "cancelled"


class StreamSender:
    def __init__(self, http: aiohttp.ClientSession, base_url: str, model: str, stream: Stream,
                 requests: list[Request], timeout_s: float, max_inflight: int):
        if max_inflight < 1:
            raise ValueError("max_inflight must be >= 1")
        self.http = http
        self.base_url = base_url
        self.model = model
        self.stream = stream
        self.requests = requests
        self.timeout_s = timeout_s
        self.slots = asyncio.Semaphore(max_inflight)
        self.headers = {TENANT_HEADER.decode(): stream.tenant}
        self.extra = {"priority": stream.priority} if stream.priority else {}
        self.late = 0    # arrivals that found every slot taken and waited for one
        self.unsent = 0  # arrivals still waiting for a slot when the arrivals' window ended
        self._sent: list[tuple[Result, asyncio.Task]] = []  # each request's Result, filled as it goes

    async def send_all(self, times: list[float], t0: float, until_s: float) -> None:
        """Send request i at t0 + times[i] (time.perf_counter()); returns once the last one is sent.
        An arrival still waiting for a slot at t0 + until_s is not sent, nor any after it (`unsent`)."""
        if len(times) > len(self.requests):
            raise ValueError(f"stream {self.stream.name}: {len(times)} arrivals but {len(self.requests)} requests")
        for i, (req, at) in enumerate(zip(self.requests, times)):
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            if self.slots.locked():
                self.late += 1
            try:
                await asyncio.wait_for(self.slots.acquire(), max(0.0, t0 + until_s - time.perf_counter()))
            except asyncio.TimeoutError:
                self.unsent = len(times) - i
                return
            res = Result(start_s=time.perf_counter() - t0, max_tokens=req.max_tokens)
            self._sent.append((res, asyncio.create_task(self._one(req, t0, res))))

    async def _one(self, req: Request, t0: float, res: Result) -> None:
        try:
            await send(self.http, self.base_url, req, self.model, self.extra, self.timeout_s, t0, self.headers, res)
        finally:
            self.slots.release()

    def open_count(self) -> int:
        return sum(1 for _, t in self._sent if not t.done())

    async def finish(self, timeout_s: float) -> None:
        """Wait until every request sent has ended, at most `timeout_s`."""
        open_tasks = [t for _, t in self._sent if not t.done()]
        if open_tasks:
            await asyncio.wait(open_tasks, timeout=timeout_s)

    async def cancel_open(self) -> int:
        """End every request still open; how many were."""
        open_tasks = [t for _, t in self._sent if not t.done()]
        for t in open_tasks:
            t.cancel()
        await asyncio.gather(*open_tasks, return_exceptions=True)
        return len(open_tasks)

    def results(self) -> list[Result]:
        """One Result per request sent, in sending order (call after cancel_open)."""
        for res, task in self._sent:
            if task.cancelled():
                res.error, res.detail, res.e2e_s = CANCELLED, "still open at the phase's end", None
        return [res for res, _ in self._sent]
