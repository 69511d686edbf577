"""AdmissionGate: how many generation requests one ingress replica takes on; the rest wait in a line
ordered by priority, or get 429 at once.

    POST /v1/chat/completions, /v1/completions ─> AdmissionMiddleware ─> gate.acquire(priority)
        ├─ fewer than max_ongoing hold a slot, nobody queued ─> a slot: on to the app
        ├─ max_ongoing hold slots, fewer than max_queued wait ─> wait for a slot handed over
        └─ max_queued already wait ─> 429 rate_limit_error, code ingress_queue_full, Retry-After, to
           the less urgent of this request and the least urgent waiter (the newer of equals): a
           waiter displaced so gets the 429 instead, and the newcomer takes its place in line
    the response has ended (streams included), the client left, or the waiter was cancelled
        ─> release(): the slot goes to the most urgent waiter (the oldest of equals), or back to the pool

Priority is the request's `priority` field, or its API key's default (api_keys.py), lower first;
equal priorities are served first come, first served, as before priorities existed. The middleware
reads the field only when the request would wait (a free slot needs no order), from the body the
guard has already buffered.

A slot is held from before the body is parsed by the app until the last byte of the response is
sent, so `max_ongoing` bounds what the replica has on the nodes and `max_queued` what it holds in
memory. The names and meanings follow Ray Serve's deployment options of the same names: ours answer
with an OpenAI error body and Retry-After, and Serve's own limits are set above them (serve_app.py)
so that Serve never answers 503 for a full replica. One replica, one event loop: no locks.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import json
from contextlib import suppress

from raypd.cluster.openai.api_errors import APIError, RateLimited
from raypd.cluster.openai.guard import caller_in
from raypd.cluster.openai.json_shape import check_json_shape
from raypd.protocol.sampling_params import PRIORITY_BOUND

GATED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


class AdmissionGate:
    def __init__(self, max_ongoing: int, max_queued: int):
        if max_ongoing < 1 or max_queued < 0:
            raise ValueError("max_ongoing must be >= 1 and max_queued >= 0")
        self.max_ongoing = max_ongoing
        self.max_queued = max_queued
        self.ongoing = 0
        self.num_refused = 0    # 429s, displaced waiters included
        self.num_displaced = 0  # waiters refused for a more urgent newcomer
        # The line: a heap of (priority, arrival, future); only futures still waiting are in it.
        self._waiters: list[tuple[int, int, asyncio.Future]] = []
        self._arrivals = itertools.count()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def would_wait(self) -> bool:
        return self.ongoing >= self.max_ongoing or bool(self._waiters)

    async def acquire(self, priority: int = 0) -> None:
        """Take a slot, waiting in line if every slot is taken; RateLimited when the line is full of
        requests at least as urgent (or, later, when a more urgent one displaces this one)."""
        if not self.would_wait():
            self.ongoing += 1
            return
        if len(self._waiters) >= self.max_queued:
            self._refuse_least_urgent_or(priority)
        waiter = asyncio.get_running_loop().create_future()
        entry = (priority, next(self._arrivals), waiter)
        heapq.heappush(self._waiters, entry)
        try:
            await waiter  # release() hands its slot over: `ongoing` already counts us
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release()  # handed a slot as we were cancelled: pass it on
            else:
                waiter.cancel()
                self._remove(entry)
            raise

    def _refuse_least_urgent_or(self, priority: int) -> None:
        """The line is full: displace its least urgent waiter if this request is more urgent, else
        refuse this request (raise)."""
        worst = max(self._waiters, key=lambda e: (e[0], e[1]), default=None)
        self.num_refused += 1
        if worst is None or worst[0] <= priority:
            raise RateLimited(f"this server is at capacity: {self.ongoing} requests in progress and "
                              f"{self.queued} waiting; retry later", code="ingress_queue_full")
        self.num_displaced += 1
        self._remove(worst)
        worst[2].set_exception(RateLimited(
            f"this server is at capacity and a more urgent request took this one's place in line "
            f"(its priority {worst[0]}); retry later", code="ingress_queue_full"))

    def _remove(self, entry: tuple[int, int, asyncio.Future]) -> None:
        with suppress(ValueError):
            self._waiters.remove(entry)
            heapq.heapify(self._waiters)

    def release(self) -> None:
        """Give a slot back: to the most urgent waiter (the oldest of equals), else to the pool."""
        while self._waiters:
            _, _, waiter = heapq.heappop(self._waiters)
            if not waiter.done():
                waiter.set_result(None)
                return
        self.ongoing -= 1

    def state(self) -> dict:
        return {"ongoing": self.ongoing, "queued": self.queued, "max_ongoing": self.max_ongoing,
                "max_queued": self.max_queued, "refused": self.num_refused, "displaced": self.num_displaced}


def requested_priority(body: bytes, default: int) -> int:
    """The body's `priority` when it is a valid one, else `default` (a malformed body waits with the
    default: the app answers it 400 once it holds a slot)."""
    try:
        check_json_shape(body)
        value = json.loads(body).get("priority")
    except (APIError, ValueError, AttributeError):
        return default
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= PRIORITY_BOUND:
        return value
    return default


class AdmissionMiddleware:
    """ASGI: each POST to a generation endpoint passes `gate` and holds its slot until the app has
    answered it completely; every other request goes straight through."""

    def __init__(self, app, gate: AdmissionGate):
        self.app = app
        self.gate = gate

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in GATED_PATHS:
            return await self.app(scope, receive, send)
        priority = caller_in(scope).priority
        if self.gate.would_wait():  # its place in line depends on its priority: read it
            first = await receive()  # the body the guard buffered, in one message
            priority = requested_priority(first.get("body", b""), priority)
            receive = replay_first(first, receive)
        try:
            await self.gate.acquire(priority)
        except RateLimited as e:
            return await e.response()(scope, receive, send)
        try:
            await self.app(scope, receive, send)
        finally:
            self.gate.release()


def replay_first(first: dict, receive):
    """A receive() that returns `first` once, then reads on from `receive`."""
    replayed = False

    async def replay():
        nonlocal replayed
        if not replayed:
            replayed = True
            return first
        return await receive()
    return replay
