"""AdmissionGate: how many generation requests one ingress replica takes on; the rest wait in a line
ordered by priority, or get 429 at once.

    POST /v1/chat/completions, /v1/completions ─> AdmissionMiddleware ─> gate.acquire(priority)
        ├─ fewer than max_ongoing hold a slot, nobody queued ─> a slot: on to the app
        ├─ max_ongoing hold slots, fewer than max_queued wait ─> wait for a slot handed over
        └─ max_queued already wait ─> 429 rate_limit_error, code ingress_queue_full, Retry-After, to
           whichever of this request and the last waiter in line comes last: a waiter displaced so
           gets the 429 instead, and the newcomer takes its place in line
        └─ every slot taken, but this request would be first in line and is owed a slot (below)
           ─> one of max_burst slots over max_ongoing, at once
    the response has ended (streams included), the client left, or the waiter was cancelled
        ─> release(tenant, tokens served, priority): the tenant is charged, the slot goes to the
           first waiter in line (or, while slots over max_ongoing are taken, back to the pool)

Priority is the request's `priority` field, or its API key's default (api_keys.py), lower first.
Within a priority, tenants share the slots by the tokens each has been served (protocol/fair_share.py: the
tenant served least goes first, then the one with fewer requests in line, each tenant's oldest
request first), and in a full line a newcomer that goes ahead so displaces the last waiter: a
flooding tenant's newest request, not another tenant's only one. With one tenant this is first
come, first served, as before. The middleware reads the `priority` field only when the request
would wait (a free slot needs no order), from the body the guard has already buffered.

Burst slots: slots go to waiters only as requests end, and under a flood that holds every slot a
request waits for the next one to end whatever its rank (seconds, for a flood of long requests). So
a request that would be first in line and is owed a slot - more urgent than a request holding one,
or of a tenant holding fewer slots than an equal share of max_ongoing among the tenants holding or
waiting for slots - takes one of `max_burst` slots over max_ongoing at once. The nodes then hold one
request more than their queues: their bounded queues refuse the request that ranks last
(engine/scheduler.py displaced_by), a flood's newest, which gives its slot back; while slots over
max_ongoing are taken, a slot given back is not handed on. So a flood can make an interactive tenant
wait for nothing but its own turn in line, and max_ongoing + max_burst bounds what the replica
has on the nodes.

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
    def __init__(self, max_ongoing: int, max_queued: int, max_burst: int | None = None):
        if max_ongoing < 1 or max_queued < 0 or (max_burst is not None and max_burst < 0):
            raise ValueError("max_ongoing must be >= 1, max_queued and max_burst >= 0")
        self.max_ongoing = max_ongoing
        self.max_queued = max_queued
        # Slots over max_ongoing for a request owed one (above); default an eighth of max_ongoing.
        self.max_burst = max(1, max_ongoing // 8) if max_burst is None else max_burst
        self.ongoing = 0
        self.num_burst = 0      # slots taken over max_ongoing (counted once each)
        self._held_by: Counter[str] = Counter()   # slots per tenant
        self._held_at: Counter[int] = Counter()   # slots per priority
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

    def _owed(self, newcomer: Waiter) -> bool:
        """Whether a newcomer takes a burst slot: one is free, it would be first in line, and it is more
        urgent than a request holding a slot or its tenant holds less than an equal share of the slots."""
        if self.ongoing >= self.max_ongoing + self.max_burst:
            return False
        if self._waiters and self._rank(newcomer) > min(map(self._rank, self._waiters)):
            return False
        if self._held_at and newcomer.priority < max(self._held_at):
            return True
        tenants = len(set(self._held_by) | set(self._in_line))  # the newcomer's own counts in line
        return self._held_by[newcomer.tenant] * tenants < self.max_ongoing

    def _take(self, priority: int, tenant: str) -> None:
        self._held_by[tenant] += 1
        self._held_at[priority] += 1

    async def acquire(self, priority: int = 0, tenant: str = "anonymous") -> None:
        """Take a slot, waiting in line if every slot is taken; RateLimited when the line is full of
        requests ahead of this one (or, later, when one that goes ahead displaces this one)."""
        if not self.would_wait():
            self.ongoing += 1
            self._take(priority, tenant)
            return
        self.shares.start_waiting(tenant, self._in_line)
        entry = Waiter(priority, next(self._arrivals), tenant, asyncio.get_running_loop().create_future())
        self._in_line[tenant] += 1  # ranked as if in line
        if self.ongoing >= self.max_ongoing and self._owed(entry):
            self._leave(entry)
            self.ongoing += 1
            self.num_burst += 1
            self._take(priority, tenant)
            return
        if len(self._waiters) >= self.max_queued:
            try:
                self._refuse_last_of(entry)
            except RateLimited:
                self._leave(entry)
                raise
        self._waiters.append(entry)
        waiter = entry.future
        try:
            await waiter  # release() hands its slot over: `ongoing` and `_held_by` already count us
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release(tenant, priority=priority)  # handed a slot as we were cancelled: pass it on
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

    def release(self, tenant: str = "anonymous", tokens: int | None = None, weight: float = 1.0,
                priority: int = 0) -> None:
        """Give back the slot a request of `tenant` at `priority` held, charging the tenant the tokens it
        was served (protocol/fair_share.py; None: nothing was served, a handed slot passed on): the slot
        goes to the first waiter in line, else (or while burst slots are taken) back to the pool."""
        if tokens is not None:
            self.shares.charge(tenant, tokens, weight, self._in_line)
        _give_back(self._held_by, tenant)
        _give_back(self._held_at, priority)
        while self._waiters and self.ongoing <= self.max_ongoing:
            first = min(self._waiters, key=self._rank)
            self._waiters.remove(first)
            self._leave(first)
            if not first.future.done():
                self._take(first.priority, first.tenant)
                first.future.set_result(None)
                return
        self.ongoing -= 1

    def state(self) -> dict:
        return {"ongoing": self.ongoing, "queued": self.queued, "max_ongoing": self.max_ongoing,
                "max_queued": self.max_queued, "max_burst": self.max_burst, "burst": self.num_burst,
                "refused": self.num_refused, "displaced": self.num_displaced}


def _give_back(held: Counter, key: object) -> None:
    held[key] -= 1
    if held[key] <= 0:
        del held[key]


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
            self.gate.release(caller.tenant, record.served_tokens if record is not None else 1, caller.weight,
                              priority)


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
