"""NodeHandle: a started node actor with what callers need to reach it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from raypd.protocol.messages import HostInfo
from raypd.protocol.roles import Role

if TYPE_CHECKING:
    from ray.actor import ActorHandle


@dataclass(frozen=True)
class NodeHandle:
    name: str
    role: Role
    actor: ActorHandle
    host: HostInfo
    num_blocks: int
    bootstrap_address: str = ""  # prefill nodes: where decode nodes register for KV (keyed)
    public_key: str = ""         # its data-plane key (Z85; ready()["public_key"]): whom a driver admits
