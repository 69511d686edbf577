"""Conductor metrics through the metrics API (metrics/ray_api.py), so they reach the Ray dashboard
and its Prometheus endpoint. Every call records nothing when Ray is not initialized (unit tests,
the simulator); tests pass a fake API and read what was recorded.

Exported (prefix raypd_conductor_):
  decision_latency_ms (histogram)          decisions_total{policy,branch} (counter)
  paths_total{path=split|local} (counter: who prefills, split_or_local.py)
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

from raypd.metrics.ray_api import NOOP, MetricsAPI, metrics_api

_LATENCY_MS = [0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 50.0]
_ERR_TOKENS = [1.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0]
_LAG_S = [0.001, 0.005, 0.02, 0.1, 0.5, 2.0, 10.0]


class ConductorMetrics:
    def __init__(self, api: MetricsAPI | None = None):
        """`api`: a module with Counter, Gauge and Histogram (tests pass a fake); default: Ray's
        when Ray is initialized, else nothing is recorded."""
        api = metrics_api(api)
        self.enabled = api is not NOOP
        p = "raypd_conductor_"
        self._latency = api.Histogram(p + "decision_latency_ms", "routing decision latency", _LATENCY_MS)
        self._decisions = api.Counter(p + "decisions_total", "decisions per policy branch", ("policy", "branch"))
        self._paths = api.Counter(p + "paths_total", "decisions per path: split (prefill node, then KV to the "
                                  "decode node) or local (the decode node prefills)", ("path",))
        self._predicted = api.Counter(p + "predicted_cached_tokens_total", "cached tokens predicted for the chosen node")
        self._delivered = api.Counter(p + "delivered_cached_tokens_total", "cached tokens nodes reported using")
        self._err = api.Histogram(p + "cached_tokens_abs_error", "|delivered - predicted| cached tokens", _ERR_TOKENS)
        self._mispredicted = api.Counter(p + "cached_tokens_mispredicted_total", "requests whose delivered cached "
                                         "tokens differ from the prediction", ("direction",))
        self._queued = api.Gauge(p + "node_queued_prefill_tokens", "queued prefill tokens", ("node", "role"))
        self._running = api.Gauge(p + "node_running", "running requests", ("node", "role"))
        self._free = api.Gauge(p + "node_free_blocks", "free KV blocks", ("node", "role"))
        self._migrations = api.Counter(p + "migrations_total", "hot-prefix migrations", ("state",))
        self._mig_bytes = api.Counter(p + "migration_bytes_total", "bytes of started migrations")
        self._blocks = api.Gauge(p + "index_blocks", "distinct blocks in the prefix index")
        self._entries = api.Gauge(p + "index_entries", "(node, block) pairs in the prefix index")
        self._resyncs = api.Counter(p + "resyncs_total", "full KV re-syncs", ("node",))
        self._events = api.Counter(p + "kv_events_total", "KV events applied")
        self._lag = api.Histogram(p + "kv_event_lag_s", "load report age when applied", _LAG_S)
        self._rejections = api.Counter(p + "rejections_total", "requests rejected by SLO admission", ("reason",))
        self._duty_orders = api.Counter(p + "duty_orders_total", "flex nodes ordered to take a duty (planners/duties.py)",
                                        ("duty",))

    def decision(self, policy: str, branch: str, latency_s: float, predicted_cached: int,
                 path: str = "split") -> None:
        self._latency.observe(latency_s * 1e3)
        self._decisions.inc(1, {"policy": policy, "branch": branch})
        self._paths.inc(1, {"path": path})
        if predicted_cached:  # Ray counters take only positive increments
            self._predicted.inc(predicted_cached)

    def delivered(self, predicted: int, delivered: int) -> None:
        if delivered:
            self._delivered.inc(delivered)
        self._err.observe(abs(delivered - predicted))
        if delivered != predicted:
            self._mispredicted.inc(1, {"direction": "over" if predicted > delivered else "under"})

    def rejection(self, reason: str) -> None:
        self._rejections.inc(1, {"reason": reason})

    def node_load(self, node: str, role: str, queued: float, running: float, free_blocks: float) -> None:
        tags = {"node": node, "role": str(role)}  # a Role member tags as its plain name
        self._queued.set(queued, tags)
        self._running.set(running, tags)
        self._free.set(free_blocks, tags)

    def migration(self, state: str, nbytes: int = 0) -> None:
        self._migrations.inc(1, {"state": state})
        if nbytes:
            self._mig_bytes.inc(nbytes)

    def index(self, blocks: int, entries: int) -> None:
        self._blocks.set(blocks)
        self._entries.set(entries)

    def events(self, applied: int) -> None:
        if applied:
            self._events.inc(applied)

    def report_lag(self, seconds: float) -> None:
        self._lag.observe(max(seconds, 0.0))

    def duty_order(self, duty: str) -> None:
        self._duty_orders.inc(1, {"duty": str(duty)})

    def resync(self, node: str) -> None:
        self._resyncs.inc(1, {"node": node})
