"""raypd's Conductor: decides, per request, which prefill node and which decode node serve it.

Map (one concept per module; everything but `actor.py` is a plain class testable without Ray):
  config.py         frozen configuration of the Conductor and its parts
  errors.py         typed errors (unknown node, no candidate, admission rejected, hash mismatch, ...)
  registry.py       nodes: role, host, handle, heartbeats, death; the slot each node occupies
  prefix_index.py   global prefix index fed by the nodes' KV events: block hash -> bitmask of slots
  topology.py       networkx graph of hosts and switches; precomputed host distance and bandwidth
  load_table.py     per-slot load arrays (reported plus routed-since-report), read by the policies
  estimates.py      prefill-time and decode-step models fitted from the nodes' measurements
  decision.py       RouteDecision and its recorded inputs; the ring buffer of recent decisions
  policies/         routing policies behind a small base class and a registry by name
  hot_prefix.py     decayed hit-frequency scores of matched prefixes
  migration.py      the hot-prefix migration planner (when, from where, to where)
  metrics.py        ray.util.metrics wrappers, no-ops when Ray is not initialized
  core.py           ConductorCore: composes the parts above; what the actor and the simulator drive
  actor.py          the Conductor Ray actor: ConductorCore plus heartbeats, re-syncs, migrations
  sim/              discrete-event simulator driving ConductorCore with simulated nodes

Imports no torch (engine.block_hash and engine.kv_events are torch-free) and no Ray at import time.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "ConductorConfig": "raypd.conductor.config", "ConductorCore": "raypd.conductor.core",
    "RouteDecision": "raypd.conductor.decision", "PrefixIndex": "raypd.conductor.prefix_index",
    "NodeRegistry": "raypd.conductor.registry", "Topology": "raypd.conductor.topology",
    "MigrationPlan": "raypd.conductor.migration", "AdmissionRejected": "raypd.conductor.errors",
    "ConductorError": "raypd.conductor.errors", "Conductor": "raypd.conductor.actor",
    "start_conductor": "raypd.conductor.actor",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'raypd.conductor' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
