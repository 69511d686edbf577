"""NodeSet: a caller's current view of the cluster's Membership (membership.py).

An ingress replica refreshes it from the node pool every refresh_s (a background task), so routing,
health and the local fallback always see the node handles and states of the latest probe round,
never a list fixed at start. Callers that own their nodes use NodeSet.fixed(nodes): all live, no
refresh. If the pool cannot be reached the last view stays in force (its states may be stale, the
routers' retries cover that) and the failure is logged once per outage.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from raypd.cluster.client.membership import Membership, MemberState
from raypd.cluster.client.node_handles import NodeHandle
from raypd.protocol.roles import Role

log = logging.getLogger(__name__)


class NodeSet:
    def __init__(self, initial: Membership, fetch: Callable[[], Awaitable[Membership]] | None = None,
                 refresh_s: float = 0.5, fetch_timeout_s: float = 5.0):
        self.membership = initial
        self._fetch = fetch
        self.refresh_s = refresh_s
        self.fetch_timeout_s = fetch_timeout_s
        self._task: asyncio.Task | None = None
        self._failing = False
        self._on_restart: list[Callable[[str], None]] = []
        self._on_leave: list[Callable[[str, MemberState], object]] = []

    @classmethod
    def fixed(cls, nodes: Sequence[NodeHandle], conductor: Any = None) -> NodeSet:
        return cls(Membership.fixed(nodes, conductor))

    @classmethod
    def of(cls, nodes: NodeSet | Sequence[NodeHandle]) -> NodeSet:
        return nodes if isinstance(nodes, NodeSet) else cls.fixed(nodes)

    def on_restart(self, listener: Callable[[str], None]) -> None:
        """Call listener(node name) whenever a refresh shows a node with a new incarnation."""
        self._on_restart.append(listener)

    def on_leave(self, listener: Callable[[str, MemberState], object]) -> None:
        """Call listener(node name, new state) whenever a refresh shows a node that was serving
        (live or draining) stop serving."""
        self._on_leave.append(listener)

    def start(self) -> None:
        if self._fetch is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def refresh(self) -> Membership:
        """Fetch the pool's membership now (also what the loop does)."""
        if self._fetch is None:
            return self.membership
        try:
            fresh = await asyncio.wait_for(self._fetch(), self.fetch_timeout_s)
        except Exception as e:  # noqa: BLE001 - keep serving from the last view
            if not self._failing:
                log.warning("cannot refresh the node membership (keeping the last one): %s", e)
            self._failing = True
            return self.membership
        if self._failing:
            log.info("node membership refreshed again")
        self._failing = False
        old, self.membership = self.membership, fresh
        for m in fresh.members:
            before = old.by_name.get(m.name)
            if before is None:
                continue
            if m.incarnation != before.incarnation:
                for listener in self._on_restart:
                    listener(m.name)
            if before.serving and not m.serving:   # a drain is no leaving: its streams go on
                for leave in self._on_leave:
                    leave(m.name, m.state)
        return fresh

    # -- lookups ------------------------------------------------------------------------------------
    def get(self, name: str) -> NodeHandle | None:
        member = self.membership.by_name.get(name)
        return member.node if member is not None else None

    def live(self, role: Role | None = None) -> list[NodeHandle]:
        return self.membership.live(role)

    def all(self) -> list[NodeHandle]:
        return [m.node for m in self.membership.members]

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            await self.refresh()
