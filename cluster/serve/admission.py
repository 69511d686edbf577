"""AdmissionGate: how many generation requests one ingress replica takes on; the rest get 429 at once.

    POST /v1/chat/completions, /v1/completions ─> AdmissionMiddleware ─> gate.acquire()
        ├─ fewer than max_ongoing hold a slot, nobody queued ─> a slot: on to the app
        ├─ max_ongoing hold slots, fewer than max_queued wait ─> wait (FIFO) for a slot handed over
        └─ max_queued already wait ─> 429 rate_limit_error, code ingress_queue_full, Retry-After
    the response has ended (streams included), the client left, or the waiter was cancelled
        ─> release(): the slot goes to the oldest waiter, or back to the pool

A slot is held from before the body is parsed until the last byte of the response is sent, so
`max_ongoing` bounds what the replica has on the nodes and `max_queued` what it holds in memory.
The names and meanings follow Ray Serve's deployment options of the same names: ours answer with an
OpenAI error body and Retry-After, and Serve's own limits are set above them (serve_app.py) so that
Serve never answers 503 for a full replica. One replica, one event loop: no locks.
"""
from __future__ import annotations

import asyncio
from collections import deque
from contextlib import suppress

from raypd.cluster.openai.api_errors import RateLimited

GATED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


class AdmissionGate:
    def __init__(self, max_ongoing: int, max_queued: int):
        if max_ongoing < 1 or max_queued < 0:
            raise ValueError("max_ongoing must be >= 1 and max_queued >= 0")
        self.max_ongoing = max_ongoing
        self.max_queued = max_queued
        self.ongoing = 0
        self.num_refused = 0
        self._waiters: deque[asyncio.Future] = deque()

    @property
    def queued(self) -> int:
        return sum(not w.done() for w in self._waiters)

    async def acquire(self) -> None:
        """Take a slot, waiting in line if every slot is taken; RateLimited when the line is full."""
        if self.ongoing < self.max_ongoing and not self._waiters:
            self.ongoing += 1
            return
        if self.queued >= self.max_queued:
            self.num_refused += 1
            raise RateLimited(f"this server is at capacity: {self.ongoing} requests in progress and "
                              f"{self.queued} waiting; retry later", code="ingress_queue_full")
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # release() hands its slot over: `ongoing` already counts us
        except BaseException:
            if waiter.done() and not waiter.cancelled():  # handed a slot as we were cancelled: pass it on
                self.release()
            else:
                waiter.cancel()
                with suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        """Give a slot back: to the oldest waiter still waiting, else to the pool."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.ongoing -= 1

    def state(self) -> dict:
        return {"ongoing": self.ongoing, "queued": self.queued, "max_ongoing": self.max_ongoing,
                "max_queued": self.max_queued, "refused": self.num_refused}


class AdmissionMiddleware:
    """ASGI: each POST to a generation endpoint passes `gate` and holds its slot until the app has
    answered it completely; every other request goes straight through."""

    def __init__(self, app, gate: AdmissionGate):
        self.app = app
        self.gate = gate

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in GATED_PATHS:
            return await self.app(scope, receive, send)
        try:
            await self.gate.acquire()
        except RateLimited as e:
            return await e.response()(scope, receive, send)
        try:
            await self.app(scope, receive, send)
        finally:
            self.gate.release()
