"""raypd's Conductor, which picks the prefill and decode node of every request (torch-free); map in docs/architecture.md."""
from __future__ import annotations

import importlib

_EXPORTS = {
    "ConductorConfig": "raypd.conductor.config", "ConductorCore": "raypd.conductor.core",
    "RouteDecision": "raypd.conductor.decision", "PrefixIndex": "raypd.conductor.prefix_index",
    "NodeRegistry": "raypd.conductor.registry", "Topology": "raypd.conductor.topology",
    "MigrationPlan": "raypd.conductor.planners.migration", "AdmissionRejected": "raypd.conductor.errors",
    "ConductorError": "raypd.conductor.errors", "Conductor": "raypd.conductor.actor",
    "start_conductor": "raypd.conductor.actor",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'raypd.conductor' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
