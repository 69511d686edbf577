"""The routing seam: which nodes serve a request, asked once per request before any node is.

Every caller that drives requests (the Serve ingress, `raypd generate --mode pd|mixed`) holds one
Router, chosen by make_router.py: conductor_router.py's ConductorRouter when a Conductor runs (it
falls back to local_router.py's LocalRouter while the Conductor is away), else RoundRobinRouter
(here). Routers choose among the live nodes of a NodeSet (node_set.py), minus `exclude`: the nodes
the caller will not use for this request (a retry's failed node, nodes its circuit breaker holds
out). The request's priority (SamplingParams.priority) comes with it: a router that estimates queues
counts only the work a node serves before it. A router may raise:
  - conductor.errors.AdmissionRejected: the SLO admission said no    -> HTTP 429 (route() only; reroute()
    lets a retry or replay of an admitted request through)
  - NoNodeError / conductor.errors.NoCandidateError: nothing can serve -> HTTP 503
(openai/api_errors.api_error maps them.)
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from raypd.cluster.client.node_handles import NodeHandle
from raypd.cluster.client.node_set import NodeSet
from raypd.conductor.policies.round_robin import Rotation
from raypd.protocol.roles import Role
from raypd.protocol.sampling_params import DEFAULT_PRIORITY


class NoNodeError(RuntimeError):
    """No node of a needed role is available."""


@dataclass(frozen=True, slots=True)
class Route:
    """Nodes for one request: a prefill node and a decode node, or one node alone (decode None): a
    mixed node, or a decode or flex node that prefills the prompt itself (the local path)."""
    prefill: NodeHandle
    decode: NodeHandle | None = None


# The roles whose nodes serve a request alone, in the order a router without the Conductor prefers
# them: a mixed node is built for it; a flex node's duty is the Conductor's to set, so without the
# Conductor it serves whole requests; a decode node does only while no prefill node lives.
_ALONE = (Role.MIXED, Role.FLEX, Role.DECODE)


def route_without_conductor(live: dict[Role, list[NodeHandle]], pick: Callable[[Role], NodeHandle]) -> Route:
    """The route the routers that know no duty or cache take (the fallback and round-robin): PD while
    prefill and decode nodes live, else one node alone. `live`: each role's usable nodes; `pick(role)`:
    one of live[role], as the router balances."""
    if live[Role.PREFILL] and live[Role.DECODE]:
        return Route(pick(Role.PREFILL), pick(Role.DECODE))
    for role in _ALONE:
        if live[role]:
            return Route(pick(role))
    raise NoNodeError("no live node can serve (no decode, mixed or flex node)")


class Router(ABC):
    """Contract: route() is called once per request (per choice when n > 1) before any node is
    contacted; it must not block the event loop, and it returns nodes the driver knows."""

    @abstractmethod
    async def route(self, request_id: str, prompt_token_ids: Sequence[int],
                    exclude: frozenset[str] = frozenset(), priority: int = DEFAULT_PRIORITY) -> Route:
        """The nodes for this request, none of them named in `exclude`; `priority`: the request's."""

    async def reroute(self, request_id: str, prompt_token_ids: Sequence[int],
                      exclude: frozenset[str] = frozenset(), priority: int = DEFAULT_PRIORITY) -> Route:
        """route() for a request already admitted: a retry or a replay of one under way. A router
        with admission control lets it through (turning it away now would break a stream it
        accepted); the others route it as any request."""
        return await self.route(request_id, prompt_token_ids, exclude, priority=priority)

    async def delivered(self, request_id: str, num_cached_tokens: int) -> None:
        """The request's prefill ran and served num_cached_tokens from cache (routers that predict it
        use this to check themselves; the others ignore it)."""
        return None


class RoundRobinRouter(Router):
    """Without a Conductor: each role's nodes in turn (route_without_conductor says which roles);
    it weighs no queue, so a request's priority changes nothing here."""

    def __init__(self, nodes: NodeSet | Sequence[NodeHandle]):
        self.nodes = NodeSet.of(nodes)
        self._turns = {role: Rotation() for role in Role}

    async def route(self, request_id: str, prompt_token_ids: Sequence[int],
                    exclude: frozenset[str] = frozenset(), priority: int = DEFAULT_PRIORITY) -> Route:
        live = {role: [n for n in self.nodes.live(role) if n.name not in exclude] for role in Role}
        return route_without_conductor(live, lambda role: self._next(live, role))

    def _next(self, live: dict[Role, list[NodeHandle]], role: Role) -> NodeHandle:
        nodes = live[role]
        return nodes[self._turns[role].next_index(len(nodes))]
