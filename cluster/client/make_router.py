"""make_router: the Router a caller uses over its nodes - the Conductor's when one runs, else round-robin."""
from __future__ import annotations

from collections.abc import Sequence

from raypd.cluster.client.conductor_router import ConductorRouter
from raypd.cluster.client.node_handles import NodeHandle
from raypd.cluster.client.node_set import NodeSet
from raypd.cluster.client.router import RoundRobinRouter, Router


def make_router(conductor, nodes: NodeSet | Sequence[NodeHandle], route_timeout_s: float = 5.0) -> Router:
    """`conductor`: the Conductor actor handle, or None (the cluster runs without one)."""
    if conductor is None:
        return RoundRobinRouter(nodes)
    return ConductorRouter(conductor, nodes, timeout_s=route_timeout_s)
