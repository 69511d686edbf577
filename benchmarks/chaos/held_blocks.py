"""What the nodes still hold after the drain, from `GET /admin/nodes`: each node's `held` counts
(requests, reservations, streams, ... all zero when idle) or its `error`. The check waits, bounded,
until every node answers idle, then sums every node's counts: 0 when everything was freed. Beside
the counts, each node's KV blocks in use from its `load` (total_blocks - free_blocks, where free counts
evictable cache blocks too): blocks held by requests, reservations or locked cache paths.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import aiohttp


@dataclass
class HeldAfter:
    total: int = 0
    per_node: dict[str, dict] = field(default_factory=dict)   # name -> its held counts
    errors: dict[str, str] = field(default_factory=dict)      # name -> why it could not say
    idle: bool = False                                         # every node answered, all zeros
    waited_s: float = 0.0
    unreadable: str | None = None                              # /admin/nodes itself failed
    blocks_in_use: dict[str, int] = field(default_factory=dict)  # name -> total_blocks - free_blocks
    pids: dict[str, int] = field(default_factory=dict)           # name -> the node actor's pid, as reported

    @property
    def blocks_total(self) -> int:
        return sum(self.blocks_in_use.values())


def sum_held(body: object) -> HeldAfter:
    """The held counts of one /admin/nodes answer; non-integer values are not counts and are skipped."""
    if not isinstance(body, dict) or not isinstance(body.get("nodes"), list):
        return HeldAfter(unreadable=f"not an /admin/nodes body: {str(body)[:120]}")
    out = HeldAfter()
    for i, n in enumerate(body["nodes"]):
        name = str(n.get("name", f"node-{i}")) if isinstance(n, dict) else f"node-{i}"
        if not isinstance(n, dict) or "error" in n or not isinstance(n.get("held"), dict):
            out.errors[name] = str(n.get("error", "no held counts") if isinstance(n, dict) else n)[:200]
            continue
        if isinstance(n.get("pid"), int):
            out.pids[name] = n["pid"]
        counts = {k: v for k, v in n["held"].items() if isinstance(v, int) and not isinstance(v, bool)}
        out.per_node[name] = counts
        out.total += sum(counts.values())
        load = n.get("load")
        if isinstance(load, dict) and isinstance(load.get("total_blocks"), int) \
                and isinstance(load.get("free_blocks"), int):
            out.blocks_in_use[name] = load["total_blocks"] - load["free_blocks"]
    out.idle = not out.errors and out.total == 0
    return out


async def read_held(http: aiohttp.ClientSession, base: str, timeout_s: float = 30.0) -> HeldAfter:
    """One `GET /admin/nodes`, summed; a failed read is a HeldAfter with `unreadable` set."""
    try:
        async with http.get(base.rstrip("/") + "/admin/nodes", timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            if r.status != 200:
                return HeldAfter(unreadable=f"GET /admin/nodes answered {r.status}")
            return sum_held(await r.json(content_type=None))
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        return HeldAfter(unreadable=f"GET /admin/nodes: {type(e).__name__}: {e}")


async def held_after_drain(http: aiohttp.ClientSession, base: str, timeout_s: float,
                           interval_s: float = 1.0) -> HeldAfter:
    start = time.monotonic()
    while True:
        last = await read_held(http, base)
        last.waited_s = time.monotonic() - start
        if last.idle or last.waited_s >= timeout_s:
            return last
        await asyncio.sleep(interval_s)
