"""Duty: which half of requests a flex node takes right now, and its drain between the two.

A flex node (flex_node/flex_node.py) holds a prefill duty and a decode duty on one engine (DutySwitch),
so it can serve either half; the Conductor's planner (conductor/planners/duties.py) assigns which. A
change never drops work: the node first finishes what its old duty holds, taking nothing new (the
Conductor routes nothing to a draining node), then reports the new duty and is routed to as such.

    PREFILL ──set_duty(decode)──> TO_DECODE ──its prefill work ended──> DECODE
    DECODE ──set_duty(prefill)──> TO_PREFILL ──its decode work ended──> PREFILL
    TO_DECODE ──set_duty(prefill)──> PREFILL (and the mirror): a drain is called off at once

The node reports its duty in every LoadReport (its heartbeat), so a restarted Conductor learns it
from the nodes rather than from its own lost state. A request routed just before a change still
lands: both halves stay able to serve whatever reaches them; the duty only steers new routing.
"""
from __future__ import annotations

from enum import Enum

from raypd.protocol.roles import Role


class Duty(str, Enum):
    PREFILL = "prefill"
    TO_DECODE = "draining-to-decode"
    DECODE = "decode"
    TO_PREFILL = "draining-to-prefill"

    def __str__(self) -> str:
        return self.value

    @property
    def settled(self) -> bool:
        return self in (Duty.PREFILL, Duty.DECODE)

    @property
    def target(self) -> Duty:
        """The duty this one is or ends as."""
        return {Duty.TO_DECODE: Duty.DECODE, Duty.TO_PREFILL: Duty.PREFILL}.get(self, self)

    @property
    def draining(self) -> Duty | None:
        """The old duty whose work must end first (None when settled)."""
        return {Duty.TO_DECODE: Duty.PREFILL, Duty.TO_PREFILL: Duty.DECODE}.get(self)

    def toward(self, target: Duty) -> Duty:
        """The state after set_duty(target): settled at once when already there or calling a drain
        off, draining otherwise."""
        target = target.target
        if target is self.target:
            return self
        if self.draining is target:   # asked back to the duty it is leaving: nothing left to drain
            return target
        return Duty.TO_DECODE if target is Duty.DECODE else Duty.TO_PREFILL

    @property
    def role(self) -> Role | None:
        """The role the Conductor routes this duty as (None: draining, routed nothing)."""
        return {Duty.PREFILL: Role.PREFILL, Duty.DECODE: Role.DECODE}.get(self)

    @classmethod
    def parse(cls, value: str) -> Duty:
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown duty {value!r}; one of {', '.join(d.value for d in cls)}") from None
