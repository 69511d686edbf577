"""AdmissionGate: how many generation requests one ingress replica takes on; the rest wait in a line
ordered by priority, or get 429 at once.

    POST /v1/chat/completions, /v1/completions ─> AdmissionMiddleware ─> gate.acquire(priority)
        ├─ fewer than max_ongoing hold a slot, nobody queued ─> a slot: on to the app
        ├─ max_ongoing hold slots, fewer than max_queued wait ─> wait for a slot handed over
        └─ max_queued already wait ─> 429 rate_limit_error, code ingress_queue_full, Retry-After, to
           whichever of this request and the last waiter in line comes last: a waiter displaced so
           gets the 429 instead, and the newcomer takes its place in line
    the response has ended (streams included), the client left, or the waiter was cancelled
        ─> release(tenant, tokens served): the tenant is charged, the slot goes to the first waiter
           in line, or back to the pool

Priority is the request's `priority` field, or its API key's default (api_keys.py), lower first.
Within a priority, tenants share the slots by the tokens each has been served (protocol/fair_share.py: the
tenant served least goes first, then the one with fewer requests in line, each tenant's oldest
request first), and in a full line a newcomer that goes ahead so displaces the last waiter: a
flooding tenant's newest request, not another tenant's only one. With one tenant this is first
come, first served, as before. The middleware reads the `priority` field only when the request
would wait (a free slot needs no order), from the body the guard has already buffered.

A slot is held from before the body is parsed by the app until the last byte of the response is
sent, so `max_ongoing` bounds what the replica has on the nodes and `max_queued` what it holds in
memory. The names and meanings follow Ray Serve's deployment options of the same names: ours answer
with an OpenAI error body and Retry-After, and Serve's own limits are set above them (serve_app.py)
so that Serve never answers 503 for a full replica. One replica, one event loop: no locks.
"""
from __future__ import annotations

import asyncio
import itertools
import json
from collections import Counter
from dataclasses import dataclass

from raypd.cluster.openai.api_errors import APIError, RateLimited
from raypd.cluster.openai.guard import caller_in
from raypd.cluster.openai.json_shape import check_json_shape
from raypd.cluster.openai.metrics import STATE_KEY
from raypd.protocol.fair_share import TenantShares
from raypd.protocol.sampling_params import PRIORITY_BOUND

GATED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


@dataclass(eq=False, slots=True)
class Waiter:
    priority: int
    arrival: int
    tenant: str
    future: asyncio.Future


class AdmissionGate:
    def __init__(self, max_ongoing: int, max_queued: int):
        if max_ongoing < 1 or max_queued < 0:
            raise ValueError("max_ongoing must be >= 1 and max_queued >= 0")
        self.max_ongoing = max_ongoing
        self.max_queued = max_queued
        self.ongoing = 0
        self.num_refused = 0    # 429s, displaced waiters included
        self.num_displaced = 0  # waiters refused for a newcomer that goes ahead of them
        self.shares = TenantShares()
        # The line: only waiters still waiting are in it. Its order changes as tenants are served, so
        # it is searched (max_queued entries) rather than kept sorted.
        self._waiters: list[Waiter] = []
        self._in_line: Counter[str] = Counter()  # waiters per tenant
        self._arrivals = itertools.count()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def would_wait(self) -> bool:
        return self.ongoing >= self.max_ongoing or bool(self._waiters)

    def _rank(self, w: Waiter) -> tuple[int, float, int, int]:
        """A waiter's place in line, smallest first: priority, its tenant's share served, how many of
        its tenant's requests wait (a tie between tenants goes to the one with fewer), arrival."""
        return w.priority, self.shares.counter(w.tenant), self._in_line[w.tenant], w.arrival

    def _leave(self, w: Waiter) -> None:
        self._in_line[w.tenant] -= 1
        if not self._in_line[w.tenant]:
            del self._in_line[w.tenant]

    async def acquire(self, priority: int = 0, tenant: str = "anonymous") -> None:
        """Take a slot, waiting in line if every slot is taken; RateLimited when the line is full of
        requests ahead of this one (or, later, when one that goes ahead displaces this one)."""
        if not self.would_wait():
            self.ongoing += 1
            return
        self.shares.start_waiting(tenant, self._in_line)
        entry = Waiter(priority, next(self._arrivals), tenant, asyncio.get_running_loop().create_future())
        self._in_line[tenant] += 1  # ranked as if in line
        if len(self._waiters) >= self.max_queued:
            try:
                self._refuse_last_of(entry)
            except RateLimited:
                self._leave(entry)
                raise
        self._waiters.append(entry)
        waiter = entry.future
        try:
            await waiter  # release() hands its slot over: `ongoing` already counts us
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release()  # handed a slot as we were cancelled: pass it on
            else:
                waiter.cancel()
                if entry in self._waiters:
                    self._waiters.remove(entry)
                    self._leave(entry)
            raise

    def _refuse_last_of(self, newcomer: Waiter) -> None:
        """The line is full: refuse whichever of the newcomer and the last waiter in line comes last
        (raise for the newcomer; the waiter displaced gets its 429 where it waits)."""
        self.num_refused += 1
        last = max(self._waiters, key=self._rank, default=None)
        if last is None or self._rank(newcomer) > self._rank(last):
            raise RateLimited(f"this server is at capacity: {self.ongoing} requests in progress and "
                              f"{self.queued} waiting; retry later", code="ingress_queue_full")
        self.num_displaced += 1
        self._waiters.remove(last)
        self._leave(last)
        why = (f"a more urgent request (its priority {last.priority})" if newcomer.priority < last.priority
               else f"a request of a tenant served less than {last.tenant!r}")
        last.future.set_exception(RateLimited(f"this server is at capacity and {why} took this one's place in "
                                              "line; retry later", code="ingress_queue_full"))

    def release(self, tenant: str | None = None, tokens: int = 0, weight: float = 1.0) -> None:
        """Give a slot back, charging `tenant` the tokens its request was served (protocol/fair_share.py):
        the slot goes to the first waiter in line, else back to the pool."""
        if tenant is not None:
            self.shares.charge(tenant, tokens, weight, self._in_line)
        while self._waiters:
            first = min(self._waiters, key=self._rank)
            self._waiters.remove(first)
            self._leave(first)
            if not first.future.done():
                first.future.set_result(None)
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
        caller = caller_in(scope)
        priority = caller.priority
        if self.gate.would_wait():  # its place in line depends on its priority: read it
            first = await receive()  # the body the guard buffered, in one message
            priority = requested_priority(first.get("body", b""), priority)
            receive = replay_first(first, receive)
        try:
            await self.gate.acquire(priority, caller.tenant)
        except RateLimited as e:
            return await e.response()(scope, receive, send)
        try:
            await self.app(scope, receive, send)
        finally:
            record = scope.get("state", {}).get(STATE_KEY)  # the metrics' record counts the tokens served
            self.gate.release(caller.tenant, record.served_tokens if record is not None else 1, caller.weight)


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
