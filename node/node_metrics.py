"""Node metrics through the metrics API (metrics/ray_api.py), fed from the node's own LoadReport (and,
for the counters, its stats() totals), so every node shows up in the Ray dashboard and on Ray's
Prometheus endpoint even when no Conductor runs. Records nothing outside Ray.

Exported (Ray adds the prefix `ray_`; counters also get `_total`), all tagged {node, role}:
  gauges   raypd_node_queued_prefill_tokens  raypd_node_running  raypd_node_waiting  raypd_node_inflight
           raypd_node_free_blocks  raypd_node_total_blocks  raypd_node_cached_blocks
           raypd_node_step_time_seconds  raypd_node_prefill_tokens_per_second
           raypd_node_transfer_rooms (kvtransfer rooms not yet terminal; from stats)
  counters raypd_node_prefill_completions  raypd_node_prefill_failures   (prefill nodes; from stats)
           raypd_node_prefix_copies{direction=export|import|failed}     (prefill nodes; from stats)
           raypd_node_refused   requests refused at once for want of capacity (every role; from stats)
           raypd_node_kv_tier_blocks{tier=host|disk,op=stored|loaded|rejected|evicted}  the KV tiers
           raypd_node_kv_tier_bytes{tier,direction=written|read}        below the pool
           raypd_node_kv_tier_load_seconds{tier}                        (engine/cache/kv_tiers.py;
           raypd_node_kv_tier_lookup_blocks   prompt blocks past the pool   from stats; hit rate of a
                    asked of the tiers                                  tier = loaded / lookups)
           raypd_node_requeued{cause=retraction|preemption}  running requests sent back to wait: the
                    pool ran dry, or a more urgent request took the place (engine/scheduler.py)

stats() keeps running totals; observe() turns each total's growth since the last call into a counter
increment, so it may be called at any rate, from any one place.
"""
from __future__ import annotations

from typing import Any

from raypd.metrics.ray_api import NOOP, Counter, MetricsAPI, metrics_api
from raypd.protocol.messages import LoadReport

TIERS = ("host", "disk")  # protocol/kv_events.KVTier below the pool, as stats() names them
_GAUGES = {  # LoadReport field -> (metric, description)
    "queued_prefill_tokens": ("queued_prefill_tokens", "prompt tokens not yet computed"),
    "running": ("running", "requests in the running batch"),
    "waiting": ("waiting", "requests not yet running"),
    "inflight": ("inflight", "requests whose KV is in flight (prefill: writing, decode: waiting)"),
    "free_blocks": ("free_blocks", "free plus evictable KV blocks"),
    "total_blocks": ("total_blocks", "KV blocks of the pool"),
    "cached_blocks": ("cached_blocks", "blocks in the prefix cache"),
    "step_time_s": ("step_time_seconds", "moving average of one engine step"),
    "prefill_tokens_per_s": ("prefill_tokens_per_second", "measured prefill speed (moving average)"),
}
# stats() path -> (counter, description, extra tags)
_TOTALS: dict[tuple[str, ...], tuple[str, str, dict[str, str]]] = {
    ("completed",): ("prefill_completions", "prefills whose KV reached the decode node", {}),
    ("failed",): ("prefill_failures", "prefills that ended with an error", {}),
    ("prefix_copies", "exported"): ("prefix_copies", "node-to-node prefix copies", {"direction": "export"}),
    ("prefix_copies", "imported"): ("prefix_copies", "node-to-node prefix copies", {"direction": "import"}),
    ("prefix_copies", "failed"): ("prefix_copies", "node-to-node prefix copies", {"direction": "failed"}),
    ("refused",): ("refused", "requests refused at once for want of capacity (HTTP 429)", {}),
    **{(f"kv_tier_{tier}_{op}",): ("kv_tier_blocks", "KV blocks through a tier below the pool",
                                   {"tier": tier, "op": op})
       for tier in TIERS for op in ("stored", "loaded", "rejected", "evicted")},
    **{(f"kv_tier_{tier}_bytes_{d}",): ("kv_tier_bytes", "bytes through a KV tier", {"tier": tier, "direction": d})
       for tier in TIERS for d in ("written", "read")},
    **{(f"kv_tier_{tier}_load_seconds",): ("kv_tier_load_seconds", "time spent loading blocks from a KV tier",
                                           {"tier": tier}) for tier in TIERS},
    ("kv_tier_lookup_blocks",): ("kv_tier_lookup_blocks", "prompt blocks past the pool asked of the KV tiers", {}),
    ("num_retractions",): ("requeued", "running requests sent back to wait", {"cause": "retraction"}),
    ("num_preemptions",): ("requeued", "running requests sent back to wait", {"cause": "preemption"}),
}
TAGS = ("node", "role")


class NodeMetrics:
    def __init__(self, api: MetricsAPI | None = None):
        """`api`: a module with Counter, Gauge and Histogram (tests pass a fake); default: Ray's
        when Ray is initialized, else nothing is recorded."""
        api = metrics_api(api)
        self.enabled = api is not NOOP
        self._last: dict[tuple, float] = {}  # (node, stats path) -> total at the last observe()
        p = "raypd_node_"
        self._gauges = {field: api.Gauge(p + name, desc, TAGS) for field, (name, desc) in _GAUGES.items()}
        self._rooms = api.Gauge(p + "transfer_rooms", "kvtransfer rooms not yet terminal", TAGS)
        self._counters: dict[str, Counter] = {}
        for name, desc, extra in _TOTALS.values():
            if name not in self._counters:
                self._counters[name] = api.Counter(p + name, desc, TAGS + tuple(extra))

    def observe(self, report: LoadReport, stats: dict | None = None) -> None:
        """Set the gauges from `report`; with `stats` (the node's stats()), also the counters and the
        transfer rooms gauge. Cheap: a dozen in-process metric updates, no I/O."""
        if not self.enabled:
            return
        tags = {"node": report.node_name, "role": str(report.role)}  # a Role member tags as its plain name
        for field, gauge in self._gauges.items():
            gauge.set(float(getattr(report, field)), tags)
        if stats is None:
            return
        rooms = (stats.get("transfer") or {}).get("live_rooms")
        if rooms is not None:
            self._rooms.set(float(rooms), tags)
        for path, (name, _, extra) in _TOTALS.items():
            total = _get(stats, path)
            if total is None:
                continue
            key = (report.node_name, path)
            grown = total - self._last.get(key, 0)
            self._last[key] = total
            if grown > 0:  # totals only grow within one node; a smaller one just becomes the new base
                self._counters[name].inc(grown, {**tags, **extra})


def _get(stats: dict, path: tuple[str, ...]) -> float | None:
    value: Any = stats
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value if isinstance(value, (int, float)) else None
