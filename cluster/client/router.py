"""The routing seam: which nodes serve a request, asked once per request before any node is.

Every caller that drives requests (the Serve ingress, `raypd generate --mode pd|mixed`) holds one
Router, chosen by make_router.py: conductor_router.py's ConductorRouter when a Conductor runs, else
RoundRobinRouter (here). A router may raise:
  - conductor.errors.AdmissionRejected: the SLO admission said no    -> HTTP 429
  - NoNodeError / conductor.errors.NoCandidateError: nothing can serve -> HTTP 503
(openai/api_errors.api_error maps them.)
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from raypd.cluster.client.node_handles import NodeHandle
from raypd.conductor.policies.round_robin import Rotation
from raypd.protocol.roles import Role


class NoNodeError(RuntimeError):
    """No node of a needed role is available."""


@dataclass(frozen=True, slots=True)
class Route:
    """Nodes for one request: a prefill node and a decode node, or a mixed node alone (decode None)."""
    prefill: NodeHandle
    decode: NodeHandle | None = None


class Router(ABC):
    """Contract: route() is called once per request (per choice when n > 1) before any node is
    contacted; it must not block the event loop, and it returns nodes the driver knows."""

    @abstractmethod
    async def route(self, request_id: str, prompt_token_ids: Sequence[int]) -> Route:
        """The nodes for this request."""

    async def delivered(self, request_id: str, num_cached_tokens: int) -> None:
        """The request's prefill ran and served num_cached_tokens from cache (routers that predict it
        use this to check themselves; the others ignore it)."""
        return None


class RoundRobinRouter(Router):
    """Without a Conductor: each role's nodes in turn; PD when prefill and decode nodes run, else
    the mixed nodes."""

    def __init__(self, nodes: Sequence[NodeHandle]):
        self._nodes = {role: [n for n in nodes if n.role == role] for role in Role}
        self._turns = {role: Rotation() for role in Role}

    async def route(self, request_id: str, prompt_token_ids: Sequence[int]) -> Route:
        if self._nodes[Role.PREFILL] and self._nodes[Role.DECODE]:
            return Route(self._next(Role.PREFILL), self._next(Role.DECODE))
        if self._nodes[Role.MIXED]:
            return Route(self._next(Role.MIXED))
        raise NoNodeError("no node is running (neither a prefill + decode pair nor a mixed node)")

    def _next(self, role: Role) -> NodeHandle:
        nodes = self._nodes[role]
        return nodes[self._turns[role].next_index(len(nodes))]
