"""LocalRouter: routing without the Conductor, from what the caller itself knows.

The ConductorRouter's fallback while the Conductor is dead, restarting or slower than its deadline,
so no request fails because the Conductor is away. Power of two choices per role: two random live
candidates (minus `exclude`), the one with less work by the node pool's last load report (waiting +
running requests, plus the queued prompt tokens the request waits behind, those at its priority or a
more urgent one, in units of `tokens_per_request`), counting the requests this router sent it since
that report. Cache-blind by design: the Conductor's index is what knows
the caches. Which roles it routes to is router.route_without_conductor's: with decode nodes live and
no prefill node, a decode node serves the request alone and prefills it itself (the local path,
NodeRequest.local_prefill): a slower first token, not a 503; flex nodes serve whole requests.
"""
from __future__ import annotations

import random
from collections.abc import Sequence

from raypd.cluster.client.node_handles import NodeHandle
from raypd.cluster.client.node_set import NodeSet
from raypd.cluster.client.router import Route, Router, route_without_conductor
from raypd.protocol.roles import Role
from raypd.protocol.sampling_params import DEFAULT_PRIORITY


class LocalRouter(Router):
    def __init__(self, nodes: NodeSet | Sequence[NodeHandle], tokens_per_request: int = 256,
                 rng: random.Random | None = None):
        self.nodes = NodeSet.of(nodes)
        self.tokens_per_request = tokens_per_request
        self._rng = rng or random.Random()
        self._sent: dict[str, tuple[float, int]] = {}   # node -> (report timestamp, routed since it)

    async def route(self, request_id: str, prompt_token_ids: Sequence[int],
                    exclude: frozenset[str] = frozenset(), priority: int = DEFAULT_PRIORITY) -> Route:
        live = {role: [n for n in self.nodes.live(role) if n.name not in exclude] for role in Role}
        return route_without_conductor(live, lambda role: self._pick(live[role], priority))

    def _pick(self, nodes: list[NodeHandle], priority: int) -> NodeHandle:
        pair = self._rng.sample(nodes, 2) if len(nodes) > 1 else nodes
        best = min(pair, key=lambda node: self._work(node, priority))
        stamp, sent = self._sent_since_report(best)
        self._sent[best.name] = (stamp, sent + 1)
        return best

    def _work(self, node: NodeHandle, priority: int) -> float:
        member = self.nodes.membership.by_name.get(node.name)
        load = member.load if member is not None else None
        _, sent = self._sent_since_report(node)
        if load is None:
            return float(sent)
        return load.waiting + load.running + load.queued_prefill_ahead_of(priority) / self.tokens_per_request + sent

    def _sent_since_report(self, node: NodeHandle) -> tuple[float, int]:
        member = self.nodes.membership.by_name.get(node.name)
        stamp = member.load.timestamp if member is not None and member.load is not None else 0.0
        last_stamp, sent = self._sent.get(node.name, (stamp, 0))
        return (stamp, 0) if last_stamp != stamp else (stamp, sent)
