"""DutyPlanner: moves flex nodes between the prefill and the decode duty as the mix of work shifts.

Two pressures, read from the load table every Conductor tick (ConductorCore.duty_signals):
  - prompt wait: seconds of prompt work queued per node that prefills, the mean over prefill-duty
    nodes of (queued + routed-since-report prompt tokens) / measured speed; with no prefill-duty
    node, over the decode-duty nodes' own queues (the prompts they prefill on the local path);
  - decode work: sequences the decode-duty nodes hold or are about to.

    prompt wait > busy_wait_s for hold_s, and a decode-duty flex node can go
        -> the flex decode node holding the fewest sequences takes the prefill duty (drains first)
    prompt wait < idle_wait_s for hold_s while decode-duty nodes hold work, and a prefill-duty flex
    node can go -> the flex prefill node with the least queued work takes the decode duty

Hysteresis three ways: two thresholds apart, a pressure must hold for hold_s, and after an order
the planner waits cooldown_s and for every drain to end before the next. At least
`min_decode_nodes` keep the decode duty; the prefill duty may drop to zero only when decode nodes
prefill for themselves (split_or_local.py), since otherwise no request could be prefilled.
Only flex nodes move; prefill, decode and mixed nodes keep the role they were started with.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from raypd.protocol.duty import Duty


@dataclass(frozen=True, slots=True)
class DutyPlannerConfig:
    enabled: bool = True          # acts only on flex nodes: a deployment without them never sees it
    busy_wait_s: float = 2.0      # prompt wait above which one more node takes up prefill
    idle_wait_s: float = 0.25     # prompt wait below which a prefill node's duty is released
    hold_s: float = 4.0           # how long a pressure must last before a node moves
    cooldown_s: float = 8.0       # after an order, before the next one
    min_prefill_nodes: int = 1    # 0 lets every node decode (only with local prefill: ConductorCore checks)
    min_decode_nodes: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.idle_wait_s < self.busy_wait_s:
            raise ValueError(f"need 0 <= idle_wait_s < busy_wait_s, got {self.idle_wait_s}, {self.busy_wait_s}")
        if self.hold_s < 0 or self.cooldown_s < 0:
            raise ValueError("hold_s and cooldown_s must be >= 0")
        if self.min_prefill_nodes < 0 or self.min_decode_nodes < 1:
            raise ValueError("need min_prefill_nodes >= 0 and min_decode_nodes >= 1")


@dataclass(frozen=True, slots=True)
class FlexState:
    """One flex node as the planner sees it."""
    name: str
    duty: Duty
    queued_s: float       # its queued prompt work, in seconds at its speed
    sequences: float      # decode sequences it holds or is about to


@dataclass(frozen=True, slots=True)
class DutySignals:
    prompt_wait_s: float        # see the module docstring
    decode_sequences: float     # over the decode-duty nodes
    prefill_nodes: int          # live nodes in the prefill duty (any role)
    decode_nodes: int           # live nodes in the decode duty (any role)
    flex: tuple[FlexState, ...] = ()


@dataclass(frozen=True, slots=True)
class DutyOrder:
    node: str
    duty: Duty                  # the duty it is to take (it drains the other first)
    reason: str
    at: float
    signals: DutySignals = field(repr=False)

    def to_dict(self) -> dict:
        return {"node": self.node, "duty": self.duty.value, "reason": self.reason, "at": self.at,
                "prompt_wait_s": self.signals.prompt_wait_s, "decode_sequences": self.signals.decode_sequences,
                "prefill_nodes": self.signals.prefill_nodes, "decode_nodes": self.signals.decode_nodes}


class DutyPlanner:
    def __init__(self, config: DutyPlannerConfig):
        self.config = config
        self._busy_since = math.inf     # when the prompt wait last rose above busy_wait_s
        self._idle_since = math.inf     # when it last fell below idle_wait_s (with decode work)
        self._last_order_at = -math.inf
        self.orders: list[DutyOrder] = []
        self.paused = False     # an operator orders duties by hand (Conductor.pause_duty_planner)

    def plan(self, now: float, s: DutySignals) -> DutyOrder | None:
        """The order this state calls for, if any (the caller carries it out)."""
        c = self.config
        busy = s.prompt_wait_s > c.busy_wait_s
        idle = s.prompt_wait_s < c.idle_wait_s and s.decode_sequences > 0
        self._busy_since = min(self._busy_since, now) if busy else math.inf
        self._idle_since = min(self._idle_since, now) if idle else math.inf
        if not c.enabled or self.paused or now - self._last_order_at < c.cooldown_s:
            return None
        if any(not f.duty.settled for f in s.flex):   # one change at a time
            return None
        order = None
        if now - self._busy_since >= c.hold_s and s.decode_nodes > c.min_decode_nodes:
            movable = [f for f in s.flex if f.duty is Duty.DECODE]
            if movable:
                f = min(movable, key=lambda f: (f.sequences, f.name))
                order = DutyOrder(f.name, Duty.PREFILL, f"prompt wait {s.prompt_wait_s:.2f}s > "
                                  f"{c.busy_wait_s:g}s for {now - self._busy_since:.1f}s", now, s)
        elif now - self._idle_since >= c.hold_s and s.prefill_nodes > c.min_prefill_nodes:
            movable = [f for f in s.flex if f.duty is Duty.PREFILL]
            if movable:
                f = min(movable, key=lambda f: (f.queued_s, f.name))
                order = DutyOrder(f.name, Duty.DECODE, f"prompt wait {s.prompt_wait_s:.2f}s < {c.idle_wait_s:g}s "
                                  f"with {s.decode_sequences:g} sequences decoding, for "
                                  f"{now - self._idle_since:.1f}s", now, s)
        if order is not None:
            self._last_order_at = now
            self._busy_since = self._idle_since = math.inf   # the next order needs a fresh hold
            self.orders.append(order)
            del self.orders[:-64]
        return order
