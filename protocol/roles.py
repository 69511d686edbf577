"""Role: what a node is built to serve (prefill, decode, both as a mixed node, or either as a flex
node whose duty the Conductor's planner assigns), the one role type.

A `str` enum, so a role crosses msgpack and Ray as its plain name ("prefill") and compares equal to
it; code names the members instead of spelling strings. `serves_prefill` / `serves_decode` say which
half of a request a node can take, so callers ask for a duty instead of listing roles. A node that
serves decode can also serve a whole request by itself: a mixed node always does, decode and flex
nodes through the local path (they prefill the prompt in their own steps).
"""
from __future__ import annotations

from enum import Enum


class Role(str, Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"  # prefill and decode on one engine, no KV transfer
    FLEX = "flex"    # a prefill node and a decode node on one engine; its duty (protocol/duty.py) may change

    def __str__(self) -> str:
        return self.value

    @property
    def serves_prefill(self) -> bool:
        return self is not Role.DECODE

    @property
    def serves_decode(self) -> bool:
        return self is not Role.PREFILL

    @classmethod
    def parse(cls, value: str) -> Role:
        """The role named `value`; ValueError naming the valid ones otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown role {value!r}; one of {', '.join(r.value for r in cls)}") from None
