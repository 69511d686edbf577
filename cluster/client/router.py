"""The ingress's one routing seam: which prefill and decode node serve a request.

RoundRobinRouter is the driver's round-robin (no Conductor); cluster/conductor_route.py's
ConductorRouter asks the Conductor actor, and is what `raypd serve` uses when it runs one. A router may raise:
  - conductor.errors.AdmissionRejected: the SLO admission said no         -> HTTP 429
  - cluster.request_driver.NoNodeError / conductor.errors.NoCandidateError -> HTTP 503
(api_errors.api_error maps them.)
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from raypd.cluster.client.node_handles import NodeHandle
from raypd.cluster.client.request_driver import NoNodeError, RequestDriver


@dataclass(frozen=True, slots=True)
class Route:
    """Nodes for one request; None lets the driver choose (mixed mode picks its mixed node itself)."""
    prefill: NodeHandle | None = None
    decode: NodeHandle | None = None


class Router(ABC):
    """Contract: route() is called once per request (per choice when n > 1) before any node is
    contacted; it must not block the event loop, and it returns nodes the driver knows."""

    @abstractmethod
    async def route(self, request_id: str, prompt_token_ids: Sequence[int]) -> Route:
        """The nodes for this request."""

    async def delivered(self, request_id: str, num_cached_tokens: int) -> None:
        """The request's prefill ran and served num_cached_tokens from cache (routers that predict it
        use this to check themselves)."""


class RoundRobinRouter(Router):
    def __init__(self, driver: RequestDriver):
        self.driver = driver

    async def route(self, request_id: str, prompt_token_ids: Sequence[int]) -> Route:
        if self.driver.mode == "mixed":
            if not self.driver.mixed:  # the driver picks the mixed node itself (round-robin)
                raise NoNodeError("no node is running")
            return Route()
        return Route(self.driver.pick("prefill"), self.driver.pick("decode"))
