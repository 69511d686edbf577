"""What one engine step cost on each kind of node during a phase, read from `GET /admin/nodes`.

Each node's load report counts the engine steps it has run (`steps`) and their summed wall time
(`step_s_total`), so the difference between the first and the last read of a phase gives every
step of the phase exactly, however few: a role's mean step = its nodes' summed time / their steps
in between. The reads every `interval_s` also sample `running`, the requests in a node's batch, when
it has any (the batch mean beside the step). A phase's mean step against the `a_alone` phase's says
how much dearer a step shared with B's requests is than one alone: A's TTFT is made of such steps
(its first token comes from the node that computes its prompt), so that ratio is the part of A's
TTFT rise the shared step explains (figures.py).

A read costs each node one call between two steps (`check_idle` walks its block counts); the same
in every phase. A node whose counters went back (it restarted) counts from its restart.
"""
from __future__ import annotations

import asyncio
import time

import aiohttp


class StepSampler:
    def __init__(self, http: aiohttp.ClientSession, base: str, interval_s: float = 1.0):
        self.http = http
        self.base = base.rstrip("/")
        self.interval_s = interval_s
        self.first: dict[str, tuple[int, float]] = {}  # node -> (steps, step_s_total) at its first read
        self.last: dict[str, tuple[int, float]] = {}   # ... and at its last
        self.roles: dict[str, str] = {}
        self.running: dict[str, list[int]] = {}        # role -> batch sizes seen while busy
        self.unreadable = 0

    def observe(self, body: object) -> None:
        """Take one /admin/nodes answer (nodes that report no load are skipped)."""
        nodes = body.get("nodes") if isinstance(body, dict) else None
        for n in nodes if isinstance(nodes, list) else []:
            load = n.get("load") if isinstance(n, dict) else None
            if not isinstance(load, dict):
                continue
            steps, total, running = load.get("steps"), load.get("step_s_total"), load.get("running")
            if not isinstance(steps, int) or not isinstance(total, (int, float)) or not isinstance(running, int):
                continue
            name, role = str(n.get("name")), str(n.get("role") or load.get("role"))
            self.roles[name] = role
            if name not in self.first or steps < self.last[name][0]:  # new, or restarted: count from here
                self.first[name] = (steps, float(total))
            self.last[name] = (steps, float(total))
            if running > 0:
                self.running.setdefault(role, []).append(running)

    def summary(self) -> dict[str, dict]:
        """role -> steps, step_time_mean_s (None without steps), running_mean (None if never busy)."""
        per_role: dict[str, list[float]] = {}
        for name, role in self.roles.items():
            acc = per_role.setdefault(role, [0, 0.0])
            acc[0] += self.last[name][0] - self.first[name][0]
            acc[1] += self.last[name][1] - self.first[name][1]
        out = {}
        for role, (steps, seconds) in sorted(per_role.items()):
            batch = self.running.get(role)
            out[role] = {"steps": int(steps), "step_time_mean_s": seconds / steps if steps else None,
                         "running_mean": sum(batch) / len(batch) if batch else None}
        return out

    async def read_once(self, timeout_s: float = 10.0) -> None:
        try:
            async with self.http.get(self.base + "/admin/nodes", timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                if r.status != 200:
                    self.unreadable += 1
                    return
                self.observe(await r.json(content_type=None))
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            self.unreadable += 1

    async def run(self, stop: asyncio.Event) -> None:
        """Read at once, then every interval_s until `stop` is set, then once more (the phase's end)."""
        while True:
            began = time.perf_counter()
            await self.read_once()
            if stop.is_set():
                return
            try:
                await asyncio.wait_for(stop.wait(), max(0.0, self.interval_s - (time.perf_counter() - began)))
            except asyncio.TimeoutError:
                pass
