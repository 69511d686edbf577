"""Routing policies by name (`make_policy("cost")`); importing the package registers the built-in ones; map in docs/architecture.md."""
from __future__ import annotations

from raypd.conductor.policies import cache_aware, cost, least_loaded, round_robin  # noqa: F401  (registers)
from raypd.conductor.policies.base import POLICIES, RoutingPolicy, RoutingView, make_policy, register_policy

__all__ = ["POLICIES", "RoutingPolicy", "RoutingView", "make_policy", "register_policy"]
