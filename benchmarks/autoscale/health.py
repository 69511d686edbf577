"""`GET /health` read every second during the run: how many nodes of each role are in each state.

The body (200 while every role has a live node, 503 otherwise, the same shape):
{"status": "ok"|"unavailable", "nodes": [{"name", "role", "state", "incarnation", "restarts"}, ...],
"conductor": {...}, "model": ...}, a node's state one of live, draining, restarting, unresponsive,
dead; a node being started is not listed until it is ready. A server that autoscales MAY add
"autoscale": {"roles": {role: {"live", "starting", "draining", "least", "most"}}, "slo": {...},
"orders": [{"role", "delta", "reason", "at"}, ...]}: optional, kept raw when present (each sample
keeps it without "orders"; the orders are gathered once each over the run, in the order first seen),
never required. A reading that fails or is not that shape is counted (`unreadable`), not a sample.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp


@dataclass(frozen=True)
class HealthSample:
    t_s: float                                  # when it was read, from the run's start
    http_status: int
    status: str                                 # "ok" | "unavailable" (as the server said)
    roles: dict[str, dict[str, int]]            # role -> state -> nodes
    autoscale: dict | None = None               # the body's "autoscale" without "orders", when present
    orders: list[dict] = field(default_factory=list)

    def count(self, role: str, state: str) -> int:
        return self.roles.get(role, {}).get(state, 0)

    def starting(self, role: str) -> int:
        """Nodes of the role being started, as the autoscale key says (0 without it)."""
        roles = (self.autoscale or {}).get("roles")
        entry = roles.get(role) if isinstance(roles, dict) else None
        value = entry.get("starting") if isinstance(entry, dict) else None
        return value if isinstance(value, int) else 0

    def as_json(self) -> dict:
        out: dict = {"t_s": round(self.t_s, 3), "http": self.http_status, "status": self.status, "roles": self.roles}
        if self.autoscale is not None:
            out["autoscale"] = self.autoscale
        return out


def parse_health(t_s: float, http_status: int, body: object) -> HealthSample:
    """One /health answer; ValueError when it is not the documented shape."""
    if not isinstance(body, dict) or not isinstance(body.get("nodes"), list):
        raise ValueError(f"not a health body: {str(body)[:120]}")
    counts: dict[str, Counter] = {}
    for n in body["nodes"]:
        if not isinstance(n, dict) or not isinstance(n.get("role"), str) or not isinstance(n.get("state"), str):
            raise ValueError(f"a node entry without a role or state: {str(n)[:120]}")
        counts.setdefault(n["role"], Counter())[n["state"]] += 1
    roles = {role: dict(sorted(c.items())) for role, c in sorted(counts.items())}
    status, raw = str(body.get("status")), body.get("autoscale")
    if not isinstance(raw, dict):
        return HealthSample(t_s, http_status, status, roles)
    orders = raw.get("orders")
    return HealthSample(t_s, http_status, status, roles, {k: v for k, v in raw.items() if k != "orders"},
                        [o for o in orders if isinstance(o, dict)] if isinstance(orders, list) else [])


class HealthSampler:
    """Reads /health every `interval_s` into `samples`, times from `t0` (time.perf_counter())."""

    def __init__(self, http: aiohttp.ClientSession, base: str, t0: float, interval_s: float = 1.0):
        self.http = http
        self.url = base.rstrip("/") + "/health"
        self.t0 = t0
        self.interval_s = interval_s
        self.samples: list[HealthSample] = []
        self.unreadable = 0
        self._orders: dict[str, dict] = {}   # each order once, by its JSON text, in the order first seen

    @property
    def orders(self) -> list[dict]:
        return list(self._orders.values())

    @property
    def autoscale_seen(self) -> bool:
        return any(s.autoscale is not None for s in self.samples)

    async def read_once(self, timeout_s: float = 5.0) -> HealthSample | None:
        at = time.perf_counter() - self.t0
        try:
            async with self.http.get(self.url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                status, raw = r.status, await r.read()
            sample = parse_health(at, status, json.loads(raw))
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            self.unreadable += 1
            return None
        self.samples.append(sample)
        for order in sample.orders:
            self._orders.setdefault(json.dumps(order, sort_keys=True, default=str), order)
        return sample

    async def run(self, stop: asyncio.Event) -> None:
        """Read at once, then every interval_s until `stop` is set."""
        while not stop.is_set():
            began = time.perf_counter()
            await self.read_once()
            try:
                await asyncio.wait_for(stop.wait(), max(0.0, self.interval_s - (time.perf_counter() - began)))
            except asyncio.TimeoutError:
                pass
