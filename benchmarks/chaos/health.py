"""What the server says about its members, and when a killed one is back.

`GET /health/ready` answers 200 while every role has a live node, 503 when no request can be served;
its body: {"status": "ok"|"unavailable", "nodes": [{"name", "role", "state", "incarnation",
"restarts"}], "conductor": {"state", "incarnation"}}, state one of live | restarting | dead (the
Conductor also none). HealthMonitor polls it and keeps the latest reading; a server without the route
(404) makes `missing` say so, and recovery is then not measured.

Recovery of a kill: from the kill until the target's entry is "live" with a higher incarnation than
before the kill, and then a probe request (a small greedy completion) has completed.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

LIVE = "live"


@dataclass(frozen=True, slots=True)
class Member:
    state: str
    incarnation: int


@dataclass(frozen=True)
class Readiness:
    http_status: int
    status: str
    nodes: dict[str, Member] = field(default_factory=dict)   # by node name
    conductor: Member | None = None
    duplicates: tuple[str, ...] = ()    # names listed more than once: a member counted twice

    def member(self, name: str, role: str) -> Member | None:
        return self.conductor if role == "conductor" else self.nodes.get(name)


def parse_ready(http_status: int, body: object) -> Readiness:
    """The body of GET /health/ready; ValueError if it is not the documented shape."""
    if not isinstance(body, dict) or not isinstance(body.get("nodes"), list):
        raise ValueError(f"not a readiness body: {str(body)[:120]}")
    nodes = {}
    duplicates = []
    for n in body["nodes"]:
        if not isinstance(n, dict) or not isinstance(n.get("name"), str):
            raise ValueError(f"a node entry without a name: {str(n)[:120]}")
        if n["name"] in nodes:
            duplicates.append(n["name"])
        nodes[n["name"]] = _member(n)
    c = body.get("conductor")
    return Readiness(http_status, str(body.get("status")), nodes, _member(c) if isinstance(c, dict) else None,
                     tuple(sorted(set(duplicates))))


def _member(entry: dict) -> Member:
    incarnation = entry.get("incarnation", 0)
    if not isinstance(incarnation, int):
        raise ValueError(f"incarnation is not an integer: {str(entry)[:120]}")
    return Member(str(entry.get("state")), incarnation)


class HealthMonitor:
    def __init__(self, http: aiohttp.ClientSession, base: str, interval_s: float = 0.5):
        self.http = http
        self.url = base.rstrip("/") + "/health/ready"
        self.interval_s = interval_s
        self.latest: Readiness | None = None
        self.latest_at = 0.0           # time.monotonic() when `latest` was read
        self.missing: str | None = None  # why readiness cannot be read, once it is known
        self.duplicates_seen: dict[str, float] = {}  # a name listed twice -> when first seen so (monotonic)

    async def read(self) -> Readiness | None:
        try:
            async with self.http.get(self.url, timeout=aiohttp.ClientTimeout(total=10)) as r:
                if r.status == 404:
                    self.missing = "GET /health/ready answered 404: the server has no readiness route"
                    return None
                status, raw = r.status, await r.read()
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return None  # not answering right now (a restart of the ingress, a busy box): try again
        try:
            ready = parse_ready(status, json.loads(raw))
        except ValueError as e:
            if status == 200:
                self.missing = f"GET /health/ready answered 200 with {e}"
                return None
            ready = Readiness(status, "unavailable")  # e.g. an error body with the 503
        self.latest, self.latest_at = ready, time.monotonic()
        for name in ready.duplicates:
            self.duplicates_seen.setdefault(name, self.latest_at)
        return ready

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set() and self.missing is None:
            await self.read()
            try:
                await asyncio.wait_for(stop.wait(), self.interval_s)
            except asyncio.TimeoutError:
                pass

    async def wait_ready(self, timeout_s: float) -> bool:
        """Until the server reports ready (status ok); True if it did. Without the route: GET /health 200."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ready = await self.read()
            if ready is not None and ready.http_status == 200 and ready.status == "ok":
                return True
            if self.missing is not None:
                return await self._plain_health_ok()
            await asyncio.sleep(self.interval_s)
        return False

    async def _plain_health_ok(self) -> bool:
        try:
            async with self.http.get(self.url.removesuffix("/ready"), timeout=aiohttp.ClientTimeout(total=10)) as r:
                return r.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False

    def live_names(self, targets: list) -> set[str] | None:
        """Names of the targets the latest reading says are live; None without a reading."""
        if self.latest is None:
            return None
        out = set()
        for t in targets:
            m = self.latest.member(t.name, t.role)
            if m is not None and m.state == LIVE:
                out.add(t.name)
        return out

    def incarnation(self, name: str, role: str) -> int | None:
        m = self.latest.member(name, role) if self.latest is not None else None
        return m.incarnation if m is not None else None

    async def recovery_s(self, name: str, role: str, before: int | None, killed_at: float, deadline: float,
                         probe: Callable[[], Awaitable[bool]]) -> float | None:
        """Seconds from `killed_at` (monotonic) until `name` is live in a newer incarnation and a probe
        completed after that; None if not by `deadline` (or if readiness cannot be read)."""
        if before is None:
            return None
        while time.monotonic() < deadline and self.missing is None:
            m = self.latest.member(name, role) if self.latest is not None and self.latest_at > killed_at else None
            if m is not None and m.state == LIVE and m.incarnation > before and await probe():
                return time.monotonic() - killed_at
            await asyncio.sleep(self.interval_s)
        return None

    async def nodes_back_s(self, names: dict[str, int | None], since: float, killed_at: float, deadline: float,
                           probe: Callable[[], Awaitable[bool]], newer: bool) -> float | None:
        """Seconds from `killed_at` until every node in `names` (name -> incarnation before) is live in a
        reading taken after `since` (with `newer`, in a higher incarnation than before) and a probe
        completed after that; None if not by `deadline`. A host's nodes after a host kill or a partition."""
        while time.monotonic() < deadline and self.missing is None:
            r = self.latest if self.latest_at > since else None
            if r is not None and all((m := r.nodes.get(name)) is not None and m.state == LIVE and (
                    not newer or before is None or m.incarnation > before) for name, before in names.items()) \
                    and await probe():
                return time.monotonic() - killed_at
            await asyncio.sleep(self.interval_s)
        return None
