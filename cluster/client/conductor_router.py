"""ConductorRouter: the routing seam answered by the Conductor actor, with a local fallback.

route() asks the Conductor for a decision (its policy weighs cache matches, load and topology) and
maps the chosen node names to the current handles of the caller's NodeSet. A decision on the local
path (RouteDecision.path, conductor/split_or_local.py) is routed to the decode node alone. After the
request, delivered() tells the Conductor how many prompt tokens the prefill node actually served from cache,
so it can compare them with its prediction. Mixed nodes serve a request alone: the prefill choice
is used.

While the Conductor is away - the node pool's probe says it is not live, a call fails, or it does
not answer within `timeout_s` - the request is routed by `fallback` (local_router.py) instead, and
the Conductor is skipped for `away_s` after a failure, so requests do not each wait out the
deadline. A decision naming a node this caller does not see live is routed by the fallback too.
Only AdmissionRejected (429) passes through: that is the Conductor's answer, not its absence.
It applies to new requests only: reroute() (a retry or replay of an admitted request) takes the
decision the rejection carries instead. The request's priority goes to the Conductor (whose
estimates, and so its SLO admission, count only the work a node serves before it) and to the
fallback.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from raypd.cluster.client.local_router import LocalRouter
from raypd.cluster.client.membership import MemberState
from raypd.cluster.client.node_handles import NodeHandle
from raypd.cluster.client.node_set import NodeSet
from raypd.cluster.client.router import Route, Router
from raypd.conductor.decision import RouteDecision
from raypd.conductor.errors import AdmissionRejected, NoCandidateError
from raypd.metrics.task_events import untracked
from raypd.protocol.roles import Role
from raypd.protocol.sampling_params import DEFAULT_PRIORITY

log = logging.getLogger(__name__)


class ConductorRouter(Router):
    def __init__(self, conductor, nodes: NodeSet | Sequence[NodeHandle], timeout_s: float = 5.0,
                 away_s: float = 1.0, fallback: Router | None = None):
        self.conductor = conductor
        self.nodes = NodeSet.of(nodes)
        self.timeout_s = timeout_s
        self.away_s = away_s
        self.fallback = fallback or LocalRouter(self.nodes)
        self._away_until = 0.0
        self.num_fallbacks = 0

    async def route(self, request_id: str, prompt_token_ids: Sequence[int],
                    exclude: frozenset[str] = frozenset(), priority: int = DEFAULT_PRIORITY) -> Route:
        if not self._conductor_usable():
            return await self._fall_back(request_id, prompt_token_ids, exclude, priority, "the Conductor is away")
        try:
            d = await asyncio.wait_for(untracked(self.conductor.route).remote(
                request_id, list(prompt_token_ids), None, sorted(exclude), priority), self.timeout_s)
        except AdmissionRejected:
            raise
        except asyncio.TimeoutError:
            self._away_until = time.monotonic() + self.away_s
            return await self._fall_back(request_id, prompt_token_ids, exclude, priority,
                                         f"the Conductor did not answer within {self.timeout_s:g}s")
        except NoCandidateError as e:  # it knows of no live candidate yet (just restarted): route locally
            return await self._fall_back(request_id, prompt_token_ids, exclude, priority, f"NoCandidateError: {e}")
        except Exception as e:  # noqa: BLE001 - dead or restarting: route locally, and skip it for away_s
            self._away_until = time.monotonic() + self.away_s
            return await self._fall_back(request_id, prompt_token_ids, exclude, priority, f"{type(e).__name__}: {e}")
        return await self._route_of(d, request_id, prompt_token_ids, exclude, priority)

    async def reroute(self, request_id: str, prompt_token_ids: Sequence[int],
                      exclude: frozenset[str] = frozenset(), priority: int = DEFAULT_PRIORITY) -> Route:
        try:
            return await self.route(request_id, prompt_token_ids, exclude, priority)
        except AdmissionRejected as e:  # admitted before: the SLO is not checked twice
            if e.decision is None:
                return await self._fall_back(request_id, prompt_token_ids, exclude, priority,
                                             "rejection without a decision")
            return await self._route_of(e.decision, request_id, prompt_token_ids, exclude, priority)

    async def _route_of(self, d: RouteDecision, request_id: str, prompt_token_ids: Sequence[int],
                        exclude: frozenset[str], priority: int) -> Route:
        """The handles of the decision's nodes, or the fallback's route when they are not live here."""
        prefill, decode = self.nodes.get(d.prefill_node), self.nodes.get(d.decode_node)
        live = {n.name for n in self.nodes.live()}
        if d.path == "local":  # the decode node prefills the prompt itself
            if decode is None or decode.name not in live:
                return await self._fall_back(request_id, prompt_token_ids, exclude, priority,
                                             f"the Conductor chose {d.decode_node} alone, not live here")
            return Route(decode)
        if prefill is None or decode is None or not {prefill.name, decode.name} <= live:
            return await self._fall_back(request_id, prompt_token_ids, exclude, priority,
                                         f"the Conductor chose {d.prefill_node}/{d.decode_node}, not live here")
        return Route(prefill) if prefill.role == Role.MIXED else Route(prefill, decode)

    async def delivered(self, request_id: str, num_cached_tokens: int) -> None:
        if not self._conductor_usable():
            return
        try:
            await asyncio.wait_for(untracked(self.conductor.report_delivered).remote(request_id, num_cached_tokens),
                                   self.timeout_s)
        except Exception as e:  # noqa: BLE001 - bookkeeping only; the request already ended
            log.debug("report_delivered(%s) failed: %s", request_id, e)

    def _conductor_usable(self) -> bool:
        state = self.nodes.membership.conductor_state
        return time.monotonic() >= self._away_until and state in (MemberState.LIVE, MemberState.NONE)

    async def _fall_back(self, request_id: str, prompt_token_ids: Sequence[int], exclude: frozenset[str],
                         priority: int, why: str) -> Route:
        self.num_fallbacks += 1
        if self.num_fallbacks == 1 or self.num_fallbacks % 100 == 0:
            log.warning("routing locally (%d so far): %s", self.num_fallbacks, why)
        return await self.fallback.route(request_id, prompt_token_ids, exclude, priority=priority)

