"""The nodes the Conductor knows: role (and a flex node's duty), host, Ray handle, heartbeats, last
load report, death.

Each live node occupies a small integer *slot*; the prefix index and the load table are indexed by
slot (bitmasks and arrays), so a slot is freed on death and reused by a later node. The clock is
injected so heartbeat expiry is testable without sleeping.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NewType

from raypd.conductor.errors import InvalidRoleError, UnknownNodeError
from raypd.protocol.duty import Duty
from raypd.protocol.messages import HostInfo, LoadReport
from raypd.protocol.roles import Role

NodeName = NewType("NodeName", str)


@dataclass(slots=True)
class NodeInfo:
    name: str
    role: Role
    host: HostInfo
    slot: int
    handle: Any = None
    bootstrap_address: str = ""     # the node's kvtransfer bootstrap endpoint (prefill side)
    registered_at: float = 0.0
    last_heartbeat: float = 0.0
    load: LoadReport | None = None
    alive: bool = True
    death_reason: str = ""
    duty: Duty | None = None        # a flex node's duty (None for a fixed role), as last ordered or reported
    duty_ordered_at: float = 0.0    # the last order's stamp: only reports echoing it overrule the order
    # The node pool drains it to remove it (cluster/autoscale/): routed nothing new, still alive
    # (its requests finish, its load still counts) until the pool removes it or calls the drain off.
    retiring: bool = False

    @property
    def routed_as(self) -> Role | None:
        """The role requests are routed to it as: its own, or its duty's (None while it drains, or
        while it retires)."""
        if self.retiring:
            return None
        return self.role if self.duty is None else self.duty.role


class NodeRegistry:
    def __init__(self, heartbeat_timeout_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.clock = clock
        self._nodes: dict[str, NodeInfo] = {}
        self._by_slot: dict[int, NodeInfo] = {}
        self._free_slots: list[int] = []
        self._next_slot = 0

    # -- membership ---------------------------------------------------------------------------
    def register(self, name: str, role: Role | str, host: HostInfo, handle: Any = None,
                 bootstrap_address: str = "", duty: Duty | str = "") -> NodeInfo:
        """Add a node. A live node of the same name is a restarted incarnation: it is released first
        (ConductorCore.register_node drops its index entries before calling this). `role` may be
        the plain name a node sends ("prefill"); a flex node sends its duty too (decode if none)."""
        try:
            role = Role.parse(role)
            node_duty = (Duty.parse(duty) if duty else Duty.DECODE) if role is Role.FLEX else None
        except ValueError as e:
            raise InvalidRoleError(str(e)) from None
        old = self._nodes.get(name)
        if old is not None and old.alive:
            self._release(old, "re-registered")
        now = self.clock()
        info = NodeInfo(name=name, role=role, host=host, slot=self._take_slot(), handle=handle,
                        bootstrap_address=bootstrap_address, registered_at=now, last_heartbeat=now, duty=node_duty)
        self._nodes[name] = info
        self._by_slot[info.slot] = info
        return info

    def heartbeat(self, name: str) -> NodeInfo:
        info = self.get_alive(name)
        info.last_heartbeat = self.clock()
        return info

    def report_load(self, report: LoadReport) -> NodeInfo:
        """A load report also counts as a heartbeat."""
        info = self.heartbeat(report.node_name)
        info.load = report
        return info

    def mark_dead(self, name: str, reason: str = "marked dead") -> NodeInfo | None:
        """Returns the node if this call killed it, None if it was already dead."""
        info = self.get(name)
        if not info.alive:
            return None
        self._release(info, reason)
        return info

    def expire(self) -> list[NodeInfo]:
        """Mark dead every live node silent for longer than the heartbeat timeout."""
        deadline = self.clock() - self.heartbeat_timeout_s
        late = [x for x in self._by_slot.values() if x.last_heartbeat < deadline]
        for info in late:
            self._release(info, f"no heartbeat for {self.heartbeat_timeout_s:g}s")
        return late

    # -- lookups ------------------------------------------------------------------------------
    def get(self, name: str) -> NodeInfo:
        try:
            return self._nodes[name]
        except KeyError:
            raise UnknownNodeError(name) from None

    def get_alive(self, name: str) -> NodeInfo:
        info = self.get(name)
        if not info.alive:
            raise UnknownNodeError(name)
        return info

    def by_slot(self, slot: int) -> NodeInfo:
        return self._by_slot[slot]

    def alive(self, role: Role | None = None) -> list[NodeInfo]:
        nodes = self._by_slot.values()
        return [x for x in nodes if role is None or x.role == role]

    def all(self) -> list[NodeInfo]:
        return list(self._nodes.values())

    @property
    def num_slots(self) -> int:
        """One past the highest slot ever used: the length the per-slot arrays need."""
        return self._next_slot

    def __contains__(self, name: str) -> bool:
        info = self._nodes.get(name)
        return info is not None and info.alive

    # -- internals ----------------------------------------------------------------------------
    def _take_slot(self) -> int:
        if self._free_slots:
            return self._free_slots.pop()
        self._next_slot += 1
        return self._next_slot - 1

    def _release(self, info: NodeInfo, reason: str) -> None:
        info.alive = False
        info.death_reason = reason
        del self._by_slot[info.slot]
        self._free_slots.append(info.slot)
