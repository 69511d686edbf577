"""NodeHandle: a started node actor with what callers need to reach it."""
from __future__ import annotations

from dataclasses import dataclass

from raypd.protocol.messages import HostInfo


@dataclass(frozen=True)
class NodeHandle:
    name: str
    role: str               # "prefill", "decode" or "mixed"
    actor: object           # ray.actor.ActorHandle
    host: HostInfo
    num_blocks: int
    bootstrap_address: str = ""  # prefill nodes: where decode nodes register for KV
