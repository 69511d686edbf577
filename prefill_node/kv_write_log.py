"""The KV write times of a prefill node's recent requests (posted -> landed at the decode node, the
sender loop's own clock: PrefillRequest.timings()["kv_write_s"]), for the node's stats(): how long
handoffs take on this node's links, per request, without a metrics stack.

Bounded: running totals, and the last RECENT requests' (request id, seconds) pairs, so that an
operator or a benchmark (benchmarks/lab/topology_run.py) can join them with the Conductor's decisions
(which decode node each request went to) by request id.
"""
from __future__ import annotations

from collections import deque
from typing import Any

RECENT = 64


class KVWriteLog:
    def __init__(self, recent: int = RECENT):
        self._recent: deque[tuple[str, float]] = deque(maxlen=recent)
        self.count = 0
        self.total_s = 0.0
        self.max_s = 0.0

    def record(self, request_id: str, timings: dict[str, float]) -> None:
        """Note the request's kv_write_s, when its timings have one (a request that failed or never
        wrote has none)."""
        seconds = timings.get("kv_write_s")
        if seconds is None:
            return
        self._recent.append((request_id, seconds))
        self.count += 1
        self.total_s += seconds
        self.max_s = max(self.max_s, seconds)

    def stats(self) -> dict[str, Any]:
        """{count, total_s, max_s, recent: [[request id, seconds], ...] oldest first}."""
        return {"count": self.count, "total_s": self.total_s, "max_s": self.max_s,
                "recent": [[rid, s] for rid, s in self._recent]}
