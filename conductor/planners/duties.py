"""DutyPlanner: moves flex nodes between the prefill and the decode duty as the mix of work shifts.

Two pressures, read from the load table every Conductor tick (ConductorCore.duty_signals):
  - prompt wait: seconds of prompt work queued per node that prefills, the mean over prefill-duty
    nodes of (queued + routed-since-report prompt tokens) / measured speed; with no prefill-duty
    node, over the decode-duty nodes' own queues (the prompts they prefill on the local path);
  - decode pressure: a decode-duty node's free KV blocks fall under decode_min_free_share of its
    pool (sequences will soon wait or be retracted), or their mean step time (the TPOT their
    sequences see) exceeds decode_busy_step_s, when that is set (from the deployment's TPOT target).

    prompt wait > busy_wait_s for hold_s, and a decode-duty flex node can go
        -> the flex decode node holding the fewest sequences takes the prefill duty (drains first)
    prompt wait < idle_wait_s under decode pressure for hold_s, and a prefill-duty flex node can go
        -> the flex prefill node with the least queued work takes the decode duty

An idle prefill node is released only when decode needs it: a decode node that keeps its TPOT
target gains nothing from a second decode node, while the released node's prompts then interleave
with decode steps (measured: docs/benchmarks.md, nodes that change duty).

Hysteresis four ways: two thresholds apart, a pressure must hold for hold_s, after an order (the
planner's or an operator's) the planner waits cooldown_s and for every drain to end before the next,
and an order that reverses the same node's last one doubles the cooldown (up to max_backoff times),
so a mix that sits between the two duties settles instead of flapping; the backoff ends once no
order was needed for four cooldowns. At least `min_decode_nodes` keep the decode duty; the prefill
duty may drop to zero only when decode nodes prefill for themselves (split_or_local.py), since
otherwise no request could be prefilled. A duty below its minimum (its last node died, or Ray
restarted a flex node in the other duty) is repaired at once, whatever the holds and the cooldown.
Only flex nodes move; prefill, decode and mixed nodes keep the role they were started with.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from raypd.conductor.config import DutyPlannerConfig
from raypd.protocol.duty import Duty


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
    decode_free_share: float = 1.0   # the least free share of KV blocks over the decode-duty nodes
    decode_step_s: float = 0.0  # their mean step time
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
        self._last_duty: dict[str, Duty] = {}   # each node's last ordered duty (a reversal backs off)
        self.backoff = 1.0                      # the cooldown's multiplier now
        self.orders: list[DutyOrder] = []
        self.paused = False     # an operator orders duties by hand (Conductor.pause_duty_planner)

    def ordered(self, now: float, node: str = "", duty: Duty | None = None) -> None:
        """An order was given (this planner's or an operator's): the cooldown starts, the holds
        restart, and reversing the node's last order doubles the next cooldown."""
        c = self.config
        if now - self._last_order_at > 4 * c.cooldown_s * self.backoff:
            self.backoff = 1.0                  # the mix settled for a while: forget the flapping
        if duty is not None:
            if self._last_duty.get(node, duty) is not duty:
                self.backoff = min(2 * self.backoff, c.max_backoff)
            self._last_duty[node] = duty
        self._last_order_at = now
        self._busy_since = self._idle_since = math.inf

    def plan(self, now: float, s: DutySignals) -> DutyOrder | None:
        """The order this state calls for, if any (the caller carries it out and calls ordered())."""
        c = self.config
        busy = s.prompt_wait_s > c.busy_wait_s
        idle = s.prompt_wait_s < c.idle_wait_s and s.decode_sequences > 0 and self._decode_pressed(s)
        self._busy_since = min(self._busy_since, now) if busy else math.inf
        self._idle_since = min(self._idle_since, now) if idle else math.inf
        if not c.enabled or self.paused:
            return None
        if (order := self._repair(now, s)) is not None:
            return self._record(order)
        if now - self._last_order_at < c.cooldown_s * self.backoff:
            return None
        if any(not f.duty.settled for f in s.flex):   # one change at a time
            return None
        order = None
        if now - self._busy_since >= c.hold_s and s.decode_nodes > c.min_decode_nodes:
            if (f := _lightest(s, Duty.DECODE)) is not None:
                order = DutyOrder(f.name, Duty.PREFILL, f"prompt wait {s.prompt_wait_s:.2f}s > "
                                  f"{c.busy_wait_s:g}s for {now - self._busy_since:.1f}s", now, s)
        elif now - self._idle_since >= c.hold_s and s.prefill_nodes > c.min_prefill_nodes:
            if (f := _lightest(s, Duty.PREFILL)) is not None:
                order = DutyOrder(f.name, Duty.DECODE, f"prompt wait {s.prompt_wait_s:.2f}s < {c.idle_wait_s:g}s "
                                  f"with {s.decode_sequences:g} sequences decoding ({self._decode_pressure(s)}), "
                                  f"for {now - self._idle_since:.1f}s", now, s)
        return self._record(order) if order is not None else None

    def _decode_pressed(self, s: DutySignals) -> bool:
        return bool(self._decode_pressure(s))

    def _decode_pressure(self, s: DutySignals) -> str:
        """Why decode needs another node ("" when it does not)."""
        limit = self.config.decode_busy_step_s
        if s.decode_free_share < self.config.decode_min_free_share:
            return f"{s.decode_free_share:.0%} of a decode node's KV blocks free"
        if limit is not None and s.decode_step_s > limit:
            return f"decode steps {s.decode_step_s * 1000:.0f} ms > {limit * 1000:.0f} ms"
        return ""

    def _repair(self, now: float, s: DutySignals) -> DutyOrder | None:
        """A duty below its minimum, counting nodes already draining toward it: the settled flex node
        of the other duty that holds the least, if the other duty can spare it."""
        c = self.config
        duties = ((Duty.DECODE, s.decode_nodes, c.min_decode_nodes, Duty.PREFILL, s.prefill_nodes, c.min_prefill_nodes),
                  (Duty.PREFILL, s.prefill_nodes, c.min_prefill_nodes, Duty.DECODE, s.decode_nodes, c.min_decode_nodes))
        for short, have, least, other, spare, other_least in duties:
            heading = sum(1 for f in s.flex if f.duty is other.toward(short))   # draining toward it already
            if have + heading < least and spare > other_least and (f := _lightest(s, other)) is not None:
                return DutyOrder(f.name, short, f"{have} nodes in the {short} duty, fewer than {least}", now, s)
        return None

    def _record(self, order: DutyOrder) -> DutyOrder:
        self.ordered(order.at, order.node, order.duty)
        self.orders.append(order)
        del self.orders[:-64]
        return order


def _lightest(s: DutySignals, duty: Duty) -> FlexState | None:
    """The settled flex node in `duty` that would be quickest to drain: the fewest sequences of a
    decode node, the least queued prompt work of a prefill node."""
    movable = [f for f in s.flex if f.duty is duty]
    if not movable:
        return None
    return min(movable, key=lambda f: (f.sequences if duty is Duty.DECODE else f.queued_s, f.name))
