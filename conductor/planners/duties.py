"""DutyPlanner: moves flex nodes between the prefill and the decode duty as the mix of work shifts.

Two pressures, each 1.0 at its threshold, read from the load table every Conductor tick
(ConductorCore.duty_signals):
  - prompt: the prompt wait over busy_wait_s. The prompt wait is the seconds of prompt work queued
    per node that prefills: the mean over prefill-duty nodes of (queued + routed-since-report
    prompt tokens) / measured speed; with no prefill-duty node, over the decode-duty nodes' own
    queues (the prompts they prefill on the local path);
  - decode: the larger of the decode-duty nodes' mean KV share in use over (1 - decode_min_free_share)
    (sequences soon wait or are retracted) and, when decode_busy_step_s is set (from the
    deployment's TPOT target), their step time over it.

Each is also projected for one node fewer on its side: the same work over p - 1 nodes
(x p / (p - 1); from one prefill node to none, the wait stays as it is: the decode nodes' local path
takes the prompts, optimistically); the same sequences over n - 1 decode nodes (their mean KV share
x n / (n - 1), never below the fullest node's, and the part of a step above the DecodeStepModel's
base x n / (n - 1): it grows with each node's batch and context).

    prompt pressure > 1 for hold_s, and the decode pressure with one decode node fewer stays under
    leave_below, and a decode-duty flex node can go
        -> the flex decode node holding the fewest sequences takes the prefill duty (drains first)
    decode pressure > 1 for hold_s, and the prompt pressure with one prefill node fewer stays under
    leave_below, and a prefill-duty flex node can go
        -> the flex prefill node with the least queued work takes the decode duty

So a node moves only toward a side in trouble, and only if the side it leaves keeps headroom
(leave_below, 0.5 by default: decode work outlives the moment, a sequence holds its KV for its
whole answer). Without the projection the planner took decode nodes for a prompt queue while decode
KV had room, then could not give them back once both sides queued (the simulator on the
conversation trace). The price of the headroom: with few decode nodes a prompt queue may get none
(two decode nodes at 23% KV use each already keep both), and when both sides are in trouble
nothing moves, since the fleet is short of nodes rather than of one duty. An idle prefill node is
not released while decode keeps its pace: a second decode node then gains nothing, while every
prompt interleaves with decode steps (measured: docs/benchmarks.md, nodes that change duty).

Hysteresis: a pressure must hold for hold_s; after an order (the planner's or an operator's) the
planner waits cooldown_s and for every drain to end before the next; an order that reverses the
same node's last one doubles the cooldown (up to max_backoff times), so a mix that sits between the
two duties settles instead of flapping; the backoff ends once no order was needed for four
cooldowns. At least `min_decode_nodes` keep the decode duty; the prefill duty may drop to zero only
when decode nodes prefill for themselves (split_or_local.py), since otherwise no request could be
prefilled. A duty below its minimum (its last node died, or Ray restarted a flex node in the other
duty) is repaired at once, whatever the holds and the cooldown. Only flex nodes move; prefill,
decode and mixed nodes keep the role they were started with.
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
    decode_kv_used: float = 0.0      # the decode-duty nodes' mean share of KV blocks in use
    decode_kv_used_max: float = 0.0  # the fullest one's
    decode_step_s: float = 0.0       # their mean step time
    decode_step_base_s: float = 0.0  # the DecodeStepModel's step with nothing to decode (the rest grows with load)
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
        self._since = {Duty.PREFILL: math.inf, Duty.DECODE: math.inf}   # since when each side wants a node
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
        self._since = {d: math.inf for d in self._since}

    # -- the two pressures (1.0 at the threshold), now or with one node fewer on their side --------------
    def prompt_pressure(self, s: DutySignals, nodes: int | None = None) -> float:
        p = s.prefill_nodes
        n = p if nodes is None else nodes
        wait = s.prompt_wait_s * p / n if n >= 1 and p >= 1 else s.prompt_wait_s   # none: the local path
        return wait / self.config.busy_wait_s

    def decode_pressure(self, s: DutySignals, nodes: int | None = None) -> tuple[float, str]:
        """The pressure and what it comes from."""
        c = self.config
        n = s.decode_nodes
        m = n if nodes is None else nodes
        if n == 0 or s.decode_sequences == 0:
            return 0.0, "nothing decoding"
        if m == 0:
            return math.inf, "no decode node"
        # now: the fullest node (one full node queues its sequences whatever the mean); projected:
        # the mean spread over the nodes left, never below the fullest
        kv = max(s.decode_kv_used * n / m, s.decode_kv_used_max) if m != n else max(s.decode_kv_used,
                                                                                   s.decode_kv_used_max)
        out = kv / (1.0 - c.decode_min_free_share), f"{kv:.0%} of a decode node's KV in use"
        if c.decode_busy_step_s is not None:
            # what a step costs above its base grows with each node's share of the sequences and their context
            base = min(s.decode_step_base_s, s.decode_step_s)
            step = base + (s.decode_step_s - base) * n / m
            p = step / c.decode_busy_step_s if c.decode_busy_step_s > 0 else math.inf
            if p > out[0]:
                out = p, f"decode steps {step * 1000:.0f} ms against {c.decode_busy_step_s * 1000:.0f} ms"
        return out

    def plan(self, now: float, s: DutySignals) -> DutyOrder | None:
        """The order this state calls for, if any (the caller carries it out and calls ordered())."""
        c = self.config
        # One change at a time; while a node drains it counts on neither side, so both pressures
        # read high: no hold runs and nothing is ordered (but a repair).
        wants = self._wants(s) if all(f.duty.settled for f in s.flex) else {}
        for duty in self._since:
            self._since[duty] = min(self._since[duty], now) if duty in wants else math.inf
        if not c.enabled or self.paused:
            return None
        if (order := self._repair(now, s)) is not None:
            return self._record(order)
        if now - self._last_order_at < c.cooldown_s * self.backoff:
            return None
        for duty, why in sorted(wants.items(), key=lambda kv: -kv[1][0]):   # the side in more trouble first
            if now - self._since[duty] >= c.hold_s:
                f = _lightest(s, Duty.DECODE if duty is Duty.PREFILL else Duty.PREFILL)
                if f is not None:
                    return self._record(DutyOrder(f.name, duty, f"{why[1]}, for {now - self._since[duty]:.1f}s",
                                                  now, s))
        return None

    def _wants(self, s: DutySignals) -> dict[Duty, tuple[float, str]]:
        """The sides that want one more node now: their pressure and the reason."""
        c = self.config
        out = {}
        prompt, (decode, source) = self.prompt_pressure(s), self.decode_pressure(s)
        if prompt > 1 and s.decode_nodes > c.min_decode_nodes:
            left, _ = self.decode_pressure(s, s.decode_nodes - 1)
            if left < c.leave_below:
                out[Duty.PREFILL] = prompt, (f"prompt wait {s.prompt_wait_s:.2f}s > {c.busy_wait_s:g}s; decode "
                                             f"pressure {decode:.2f} -> {left:.2f} with one node fewer")
        if decode > 1 and s.prefill_nodes > c.min_prefill_nodes:
            left = self.prompt_pressure(s, s.prefill_nodes - 1)
            if left < c.leave_below:
                out[Duty.DECODE] = decode, (f"{source} (pressure {decode:.2f}) with {s.decode_sequences:g} "
                                            f"sequences decoding; prompt wait {s.prompt_wait_s:.2f}s -> "
                                            f"{left * c.busy_wait_s:.2f}s with one prefill node fewer")
        return out

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
