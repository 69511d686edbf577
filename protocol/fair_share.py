"""Tenant fairness: Virtual Token Counters (Sheng et al., "Fairness in Serving Large Language
Models", OSDI 2024), the order in which waiting requests of one priority start. One algorithm in two
places: the ingress's line (cluster/serve/admission.py: who gets a slot) and each node's waiting
queue (engine/scheduler.py: who is admitted to run), the latter charging the tokens it computes.

    counter[t]   tokens served to tenant t (prompt + output, as its responses' usage counts them),
                 divided by t's weight (api_keys.py: `weight`, default 1)
    next slot    among the most urgent waiters, the one whose tenant has the smallest counter
                 (the oldest of equals): the tenant served least so far goes first
    a tenant that starts waiting again is lifted to the smallest counter among the tenants waiting,
                 so time spent idle banks no credit to flood with later

Work-conserving: fairness only orders the line, a free slot always goes to whoever waits, and a
tenant alone gets every slot. Charged when a request ends (its tokens are known then); a request
that never reached generation is charged one token, so that a tenant's refused or failed requests
still cost it a place. Tenants whose counters are at or below every waiting tenant's are forgotten
past MAX_TENANTS: they would be lifted to that on their next request anyway.
"""
from __future__ import annotations

from collections.abc import Iterable

MAX_TENANTS = 4096


class TenantShares:
    def __init__(self) -> None:
        self.counters: dict[str, float] = {}

    def counter(self, tenant: str) -> float:
        return self.counters.get(tenant, 0.0)

    def start_waiting(self, tenant: str, waiting: Iterable[str]) -> None:
        """`tenant` joins the line where `waiting` (the tenants already in it) wait: lift it if it has
        no request there."""
        others = set(waiting)
        if tenant in others or not others:
            return
        floor = min(self.counter(t) for t in others)
        if self.counter(tenant) < floor:
            self.counters[tenant] = floor

    def charge(self, tenant: str, tokens: int, weight: float, waiting: Iterable[str]) -> None:
        self.counters[tenant] = self.counter(tenant) + max(tokens, 1) / weight
        if len(self.counters) > MAX_TENANTS:
            self._forget_idle(set(waiting))

    def _forget_idle(self, waiting: set[str]) -> None:
        floor = min((self.counter(t) for t in waiting), default=float("inf"))
        for t in [t for t, c in self.counters.items() if t not in waiting and c <= floor]:
            del self.counters[t]
