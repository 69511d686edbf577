"""Routing policies, pluggable by name: make_policy("cost") etc. Importing this package registers
the built-in ones."""
from __future__ import annotations

from raypd.conductor.policies.base import POLICIES, RoutingPolicy, RoutingView, make_policy, register_policy
from raypd.conductor.policies import cache_aware, cost, least_loaded, round_robin  # noqa: F401  (registers)

__all__ = ["POLICIES", "RoutingPolicy", "RoutingView", "make_policy", "register_policy"]
