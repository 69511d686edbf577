"""Conductor metrics through ray.util.metrics, so they reach the Ray dashboard and its Prometheus
endpoint. Every method is a no-op when Ray is not initialized (unit tests, the simulator), and ray
is imported only when it already is, so this module costs nothing outside a cluster.

Exported (prefix raypd_conductor_):
  decision_latency_ms (histogram)          decisions_total{policy,branch} (counter)
  predicted_cached_tokens_total (counter)  delivered_cached_tokens_total (counter)
  cached_tokens_abs_error (histogram, |delivered - predicted| per reported request)
  cached_tokens_mispredicted_total{direction=over|under} (counter)
  node_queued_prefill_tokens{node,role}    node_running{node,role}   node_free_blocks{node,role}
  migrations_total{state=started|finished|failed} (counter)    migration_bytes_total (counter)
  index_blocks (gauge)   index_entries (gauge)   resyncs_total{node} (counter)
  kv_events_total (counter)   kv_event_lag_s (histogram: node timestamp -> applied)
  rejections_total{reason} (counter)
"""
from __future__ import annotations

import sys

_LATENCY_MS = [0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 50.0]
_ERR_TOKENS = [1, 16, 64, 256, 1024, 4096, 16384]
_LAG_S = [0.001, 0.005, 0.02, 0.1, 0.5, 2.0, 10.0]


def ray_initialized() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


class ConductorMetrics:
    def __init__(self, enabled: bool | None = None):
        self.enabled = ray_initialized() if enabled is None else enabled
        if not self.enabled:
            return
        from ray.util.metrics import Counter, Gauge, Histogram

        p = "raypd_conductor_"
        self._latency = Histogram(p + "decision_latency_ms", "routing decision latency", _LATENCY_MS)
        self._decisions = Counter(p + "decisions_total", "decisions per policy branch", ("policy", "branch"))
        self._predicted = Counter(p + "predicted_cached_tokens_total", "cached tokens predicted for the chosen node")
        self._delivered = Counter(p + "delivered_cached_tokens_total", "cached tokens nodes reported using")
        self._err = Histogram(p + "cached_tokens_abs_error", "|delivered - predicted| cached tokens", _ERR_TOKENS)
        self._mispredicted = Counter(p + "cached_tokens_mispredicted_total", "requests whose delivered cached "
                                     "tokens differ from the prediction", ("direction",))
        self._queued = Gauge(p + "node_queued_prefill_tokens", "queued prefill tokens", ("node", "role"))
        self._running = Gauge(p + "node_running", "running requests", ("node", "role"))
        self._free = Gauge(p + "node_free_blocks", "free KV blocks", ("node", "role"))
        self._migrations = Counter(p + "migrations_total", "hot-prefix migrations", ("state",))
        self._mig_bytes = Counter(p + "migration_bytes_total", "bytes of started migrations")
        self._blocks = Gauge(p + "index_blocks", "distinct blocks in the prefix index")
        self._entries = Gauge(p + "index_entries", "(node, block) pairs in the prefix index")
        self._resyncs = Counter(p + "resyncs_total", "full KV re-syncs", ("node",))
        self._events = Counter(p + "kv_events_total", "KV events applied")
        self._lag = Histogram(p + "kv_event_lag_s", "load report age when applied", _LAG_S)
        self._rejections = Counter(p + "rejections_total", "requests rejected by SLO admission", ("reason",))

    def decision(self, policy: str, branch: str, latency_s: float, predicted_cached: int) -> None:
        if self.enabled:
            self._latency.observe(latency_s * 1e3)
            self._decisions.inc(1, {"policy": policy, "branch": branch})
            if predicted_cached:
                self._predicted.inc(predicted_cached)

    def delivered(self, predicted: int, delivered: int) -> None:
        if self.enabled:
            if delivered:
                self._delivered.inc(delivered)
            self._err.observe(abs(delivered - predicted))
            if delivered != predicted:
                self._mispredicted.inc(1, {"direction": "over" if predicted > delivered else "under"})

    def rejection(self, reason: str) -> None:
        if self.enabled:
            self._rejections.inc(1, {"reason": reason})

    def node_load(self, node: str, role: str, queued: float, running: float, free_blocks: float) -> None:
        if self.enabled:
            tags = {"node": node, "role": role}
            self._queued.set(queued, tags)
            self._running.set(running, tags)
            self._free.set(free_blocks, tags)

    def migration(self, state: str, nbytes: int = 0) -> None:
        if self.enabled:
            self._migrations.inc(1, {"state": state})
            if nbytes:
                self._mig_bytes.inc(nbytes)

    def index(self, blocks: int, entries: int) -> None:
        if self.enabled:
            self._blocks.set(blocks)
            self._entries.set(entries)

    def events(self, applied: int) -> None:
        if self.enabled and applied:
            self._events.inc(applied)

    def report_lag(self, seconds: float) -> None:
        if self.enabled:
            self._lag.observe(max(seconds, 0.0))

    def resync(self, node: str) -> None:
        if self.enabled:
            self._resyncs.inc(1, {"node": node})
