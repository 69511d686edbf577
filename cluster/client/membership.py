"""Membership: which nodes (and which Conductor) exist right now and in what state.

The node pool's supervisor (serve/supervisor.py) makes one every probe round; ingress replicas
fetch it (node_set.py) and route, report health and fall back from it. A frozen snapshot with a
version that grows with every change, so a reader can tell it has the latest.

    LIVE ─call fails: actor restarting─> RESTARTING ─ready() answers, new instance─> LIVE (incarnation + 1)
    LIVE ─probe times out─> UNRESPONSIVE ─answers again─> LIVE
    LIVE ─the pool drains it to remove it─> DRAINING ─idle─> (left the membership)
                                              └─drain called off─> LIVE;  a failure as from LIVE
    any ─actor died for good (max restarts used up)─> DEAD

A DRAINING node is routed nothing new but its requests go on: it has not left (a reader must not
end its streams), it is just not offered to new work.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from raypd.cluster.client.node_handles import NodeHandle
from raypd.protocol.messages import LoadReport
from raypd.protocol.roles import Role


class MemberState(str, Enum):
    LIVE = "live"
    RESTARTING = "restarting"        # the actor died and Ray is starting a fresh incarnation
    UNRESPONSIVE = "unresponsive"    # alive as far as Ray knows, but its last probe timed out
    DRAINING = "draining"            # serving what it holds, routed nothing new: the pool removes it once idle
    DEAD = "dead"                    # gone for good: its restarts are used up
    NONE = "none"                    # (Conductor only) the application runs without one


@dataclass(frozen=True, slots=True)
class Member:
    node: NodeHandle                 # the current incarnation's handle (bootstrap address included)
    state: MemberState = MemberState.LIVE
    incarnation: int = 0             # 0 for the first instance, + 1 with every restart seen
    restarts: int = 0
    load: LoadReport | None = None   # the last load report the probe read
    reason: str = ""                 # why it is not LIVE

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def serving(self) -> bool:
        """Its requests run on: live, or draining (routed nothing new, but not gone)."""
        return self.state in (MemberState.LIVE, MemberState.DRAINING)

    def health(self) -> dict:
        body: dict[str, Any] = {"name": self.name, "role": str(self.node.role), "state": self.state.value,
                                "incarnation": self.incarnation, "restarts": self.restarts}
        if self.reason:
            body["reason"] = self.reason
        return body


@dataclass(frozen=True, slots=True)
class Membership:
    version: int
    members: tuple[Member, ...]
    conductor: Any = None            # the Conductor actor handle (None: no Conductor)
    conductor_state: MemberState = MemberState.NONE
    conductor_incarnation: int = 0
    autoscale: dict | None = field(default=None, compare=False)   # the pool scaler's status, when it runs
    by_name: dict[str, Member] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {m.name: m for m in self.members})

    @classmethod
    def fixed(cls, nodes: Sequence[NodeHandle], conductor: Any = None) -> Membership:
        """Every node live, never refreshed: callers that own their nodes (raypd generate, tests)."""
        state = MemberState.LIVE if conductor is not None else MemberState.NONE
        return cls(0, tuple(Member(n) for n in nodes), conductor, state)

    def live(self, role: Role | None = None) -> list[NodeHandle]:
        return [m.node for m in self.members
                if m.state is MemberState.LIVE and (role is None or m.node.role == role)]

    @property
    def can_serve(self) -> bool:
        """A request can be served: a live decode node (with a live prefill node, or prefilling for
        itself while none lives: the local path), a live mixed node or a live flex node: any node
        that decodes can serve whole requests."""
        return any(self.live(role) for role in Role if role.serves_decode)

    @property
    def may_recover(self) -> bool:
        """A node that decodes is not dead for good: a request that finds no node now may find one by
        waiting (it is restarting or unresponsive, or live and held out by the request itself)."""
        return any(m.state is not MemberState.DEAD for m in self.members if m.node.role.serves_decode)

    def health(self) -> dict:
        """/health's body: the verdict, each node's state and the Conductor's."""
        return {"status": "ok" if self.can_serve else "unavailable",
                "nodes": [m.health() for m in self.members],
                "conductor": {"state": self.conductor_state.value, "incarnation": self.conductor_incarnation},
                **({"autoscale": self.autoscale} if self.autoscale is not None else {})}
