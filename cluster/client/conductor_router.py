"""ConductorRouter: the routing seam answered by the Conductor actor.

route() asks the Conductor for a decision (its policy weighs cache matches, load and topology) and
maps the chosen node names back to the handles the driver knows. After the request, delivered()
tells the Conductor how many prompt tokens the prefill node actually served from cache, so it can
compare them with its prediction. Mixed nodes serve a request alone: the prefill choice is used.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from raypd.cluster.client.node_handles import NodeHandle
from raypd.cluster.client.router import NoNodeError, Route, Router
from raypd.conductor.errors import NoCandidateError
from raypd.protocol.roles import Role

log = logging.getLogger(__name__)


class ConductorRouter(Router):
    def __init__(self, conductor, nodes: Sequence[NodeHandle], timeout_s: float = 10.0):
        self.conductor = conductor
        self.nodes = {n.name: n for n in nodes}
        self.timeout_s = timeout_s

    async def route(self, request_id: str, prompt_token_ids: Sequence[int]) -> Route:
        try:
            d = await asyncio.wait_for(self.conductor.route.remote(request_id, list(prompt_token_ids)), self.timeout_s)
        except NoCandidateError as e:
            raise NoNodeError(str(e)) from e
        except asyncio.TimeoutError as e:
            raise NoNodeError(f"the Conductor did not answer within {self.timeout_s:.0f}s") from e
        try:
            prefill = self.nodes[d.prefill_node]
            decode = self.nodes[d.decode_node]
        except KeyError as e:
            raise NoNodeError(f"the Conductor chose node {e.args[0]!r}, unknown to this caller") from e
        return Route(prefill) if prefill.role == Role.MIXED else Route(prefill, decode)

    async def delivered(self, request_id: str, num_cached_tokens: int) -> None:
        try:
            await asyncio.wait_for(self.conductor.report_delivered.remote(request_id, num_cached_tokens),
                                   self.timeout_s)
        except Exception as e:  # noqa: BLE001 - bookkeeping only; the request already ended
            log.debug("report_delivered(%s) failed: %s", request_id, e)
