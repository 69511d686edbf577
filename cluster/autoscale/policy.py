"""ScalePolicy: when the node pool adds a node of a role, removes one, or calls a drain off, judged by
the SLO attainment the ingress replicas count and the load the nodes report.

Each tick (AutoscaleConfig.tick_s) the pool measures ScaleSignals: the SLO counts of the window
(slo_counts.SloWindow.over(now, since=policy.changed_at): only requests that finished since the pool
last changed), and per scaled role its nodes (live, starting, draining), busy share, waiting
requests and KV in use. decide() returns at most one ScaleOrder; the pool carries it out and calls
done() when it ended (the node serves, is gone, or the drain was called off; or it failed).

Pressures, each 1.0 at its threshold; a role above 1 is short:

    pressure  value                                          points to
    TTFT      miss share / (1 - attainment), refusals as     the role that prefills: PREFILL, else FLEX,
              misses, with >= min_samples requests           else MIXED; DECODE instead when decode is
                                                             queueing and that role is not
    TPOT      the same over the requests with a TPOT         the role that decodes: DECODE, else FLEX,
                                                             else MIXED
    queue     waiting per live node / queue_per_node         the role itself
    step      step time / (early_share x TPOT target)        the role itself, if it decodes
    wait      prompt wait for compute / (early_share x       the role itself, if it prefills
              TTFT target)

TTFT and TPOT judge requests that finished: a window late, and on a batching engine the queue can
take half a minute of overload to show in them (measured: docs/benchmarks.md, "Autoscaling under a
load step"). Step and wait read what the requests running now see, so a load step is caught within
a hold.

Queueing (for the TTFT redirect): waiting per live node above queue_per_node, or, for a role that
decodes, KV in use above kv_full: prompts then wait for decode memory, and a prefill node more would
only queue more of them there. A role's pressure is the largest pointing to it; the most pressed
role whose hold ran goes first.

    rule    when                                                        order
    repair  live + starting < least (a node died for good), at once,    +1, or call a drain off
            whatever the holds and cooldowns; after a failed start of
            the role, up_cooldown_s before the next try
    up      short for up_hold_s; no node starting anywhere; below       call one of its drains off if
            most; up_cooldown_s since its last addition (or call-off)   one runs, else +1
            ended, or failed
    down    for down_hold_s: no role short and no SLO shortfall; its     -1 (the caller removes its
            waiting per node <= queue_per_node / 4; busy share x live   lightest node)
            / (live - 1) < idle_share, or, for a role that decodes,
            its step time and prompt wait with one node fewer under
            idle_share of the TPOT and TTFT targets (a batching engine
            steps while one sequence runs: busy, yet with room); for a
            role that decodes, KV in use x live / (live - 1) < kv_full;
            live > least; nothing starting, draining or ordered;
            down_cooldown_s since the last order was given or ended

One order at a time per role. An addition also waits while any node starts (its effect on the
other roles' signals is not in yet); a drain call-off does not (it starts nothing and takes effect
at once), and replaces the role's removal in flight. A removal waits for everything. An addition to
one role may be ordered while another role's removal drains: a drain can take drain_timeout_s, too
long to leave a role short; no single decide() ever both adds and removes.

Hysteresis: holds run while an order waits (for a start, a cooldown). An up hold restarts when its
condition breaks for one tick; a down hold only when its role has not been idle for down_break_s
(any role short counts as not idle: a pool short anywhere does not shrink anywhere; in PD a decode
node idles while prefill is the bottleneck, and goes back to work once prefill catches up). Under
Poisson arrivals a burst of a few seconds lifts a step time or a queue now and then, and a hold
that any one tick ended would never reach down_hold_s (measured: the pool kept 3 nodes through 4
minutes at a third of the load that called for them). A removal is still ordered only on a tick
where no role is short and its role is idle. An order resets its role's up hold and every down
hold. A role at its most does not grow: its note says so (notes, status()).

The SLO counts restart when an order ends with the pool changed (done(ok=True) moves changed_at):
the misses that called for a node would otherwise call for another while they stay in the window.
With fewer than min_samples requests since, attainment is unknown and the queues judge alone;
up_cooldown_s gives the new node time to take work before its role grows again. Removal keeps a
wide margin (down_hold_s, a busy share under idle_share with one node fewer, a queue under a
quarter of queue_per_node): a wrong removal costs a start of minutes to undo, a late one only idle
nodes.

Removal picks no node: the caller removes its lightest node of the role (drain, then stop). The
policy is pure: no Ray, no asyncio, no clock; time comes in as `at`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from raypd.cluster.autoscale.config import AutoscaleConfig
from raypd.cluster.autoscale.slo_counts import SloCounts
from raypd.protocol.roles import Role

# Which scaled role a shortfall of each half of a request points to, first present wins.
PROMPT_ROLES = (Role.PREFILL, Role.FLEX, Role.MIXED)
DECODE_ROLES = (Role.DECODE, Role.FLEX, Role.MIXED)


@dataclass(frozen=True, slots=True)
class RoleLoad:
    """One scaled role as the pool measured it this tick."""
    role: Role
    live: int               # nodes serving
    starting: int = 0       # being added, not ready yet
    draining: int = 0       # being removed: finishing their work, routed nothing
    busy_share: float = 0.0  # mean over live nodes of the share of wall time their engine stepped, 0..1
    waiting: float = 0.0    # requests waiting for this role's capacity, summed over live nodes: prefill,
                            # mixed: prompts queued for the engine (not a prefill node's bootstrap queue,
                            # which waits for the decode side); decode: waiting for KV memory (not the
                            # transfer queue, which waits for the prefill side)
    kv_used: float = 0.0    # mean share of KV blocks held by requests (not by the prefix cache), 0..1
    # What requests on the role's nodes see now, before any of them finishes (attainment comes only
    # from requests that finished, a window late):
    step_s: float = 0.0     # mean engine step time over the live nodes running something: a decoding
                            # sequence's time per output token (0: nothing runs)
    step_base_s: float = 0.0  # the shortest such step seen on the role's nodes: the part of a step
                              # that does not grow with the batch (0: not known yet)
    prompt_wait_s: float = 0.0  # mean over live nodes of queued prompt tokens / prefill speed: how long
                                # a new prompt waits for compute there

    def __post_init__(self) -> None:
        if min(self.live, self.starting, self.draining) < 0:
            raise ValueError(f"negative node count in {self}")

    @property
    def waiting_per_node(self) -> float:
        return _per_node(self.waiting, self.live)

    @property
    def busy_one_fewer(self) -> float:
        """The busy share the same work would give one node fewer."""
        return _one_fewer(self.busy_share, self.live)

    @property
    def kv_one_fewer(self) -> float:
        """The KV share in use the same requests would give one node fewer."""
        return _one_fewer(self.kv_used, self.live)

    @property
    def step_one_fewer(self) -> float:
        """The step time one node fewer would give: the part above the base grows with each node's
        batch (the same sequences over live - 1 nodes)."""
        base = min(self.step_base_s, self.step_s) if self.step_base_s > 0 else 0.0
        return base + _one_fewer(self.step_s - base, self.live)

    @property
    def prompt_wait_one_fewer(self) -> float:
        return _one_fewer(self.prompt_wait_s, self.live)


@dataclass(frozen=True, slots=True)
class ScaleSignals:
    at: float
    slo: SloCounts                  # the window's counts since the pool last changed (policy.changed_at)
    roles: dict[Role, RoleLoad]     # the scaled roles only


@dataclass(frozen=True, slots=True)
class ScaleOrder:
    """Add a node of `role` (+1), remove one (-1), or, with cancel_drain, take back one of its
    draining nodes instead of adding (cheaper: it is warm and needs no start)."""
    role: Role
    delta: int
    reason: str
    at: float
    cancel_drain: bool = False

    def __post_init__(self) -> None:
        if self.delta not in (1, -1):
            raise ValueError(f"a scale order adds or removes one node, got delta {self.delta}")
        if self.cancel_drain and self.delta != 1:
            raise ValueError("calling a drain off adds a node back: delta must be +1")

    @property
    def kind(self) -> Literal["add", "remove", "cancel-drain"]:
        return "cancel-drain" if self.cancel_drain else "add" if self.delta > 0 else "remove"

    def to_dict(self) -> dict:
        return {"role": self.role.value, "delta": self.delta, "kind": self.kind, "cancel_drain": self.cancel_drain,
                "reason": self.reason, "at": self.at}


class ScalePolicy:
    """The rules of the module docstring, with what they remember: holds, cooldowns, orders in flight."""

    def __init__(self, config: AutoscaleConfig):
        self.config = config
        roles = config.roles
        self._ranges = {r.role: r for r in config.ranges}
        self._up_since = {r: math.inf for r in roles}       # since when each role is short
        self._down_since = {r: math.inf for r in roles}     # since when each role is idle
        self._idle_at = {r: -math.inf for r in roles}       # the last tick it was
        self._grown_at = {r: -math.inf for r in roles}      # when its last addition (or call-off) ended
        self._failed_at = {r: -math.inf for r in roles}     # when its last start failed
        self._in_flight: dict[Role, ScaleOrder] = {}
        self._last_event_at = -math.inf                     # the last order given or ended
        self.changed_at = -math.inf                         # the last order that ended with the pool changed
        self.orders: list[ScaleOrder] = []                  # the last 64
        self.notes: dict[str, str] = {}                     # per role (and "slo"): what the last tick read

    @property
    def in_flight(self) -> tuple[ScaleOrder, ...]:
        return tuple(self._in_flight.values())

    def decide(self, s: ScaleSignals) -> ScaleOrder | None:
        """The order this tick calls for, if any (the caller carries it out and calls done())."""
        c = self.config
        s = replace(s, roles={r: load for r, load in s.roles.items() if r in self._ranges})
        self.notes = {"slo": self._slo_note(s.slo)}
        for role in c.roles:
            if (load := s.roles.get(role)) is not None:
                self.notes[role.value] = (f"{load.live} live, {load.starting} starting, {load.draining} draining; "
                                          f"busy {load.busy_share:.0%}, {load.waiting_per_node:.1f} waiting per node, "
                                          f"KV {load.kv_used:.0%}")
            else:
                self.notes[role.value] = "not measured this tick"
        wants = self._wants(s)
        idle = self._idle(s) if not wants else {}
        for role in c.roles:
            self._up_since[role] = min(self._up_since[role], s.at) if role in wants else math.inf
            if role in idle:
                self._down_since[role] = min(self._down_since[role], s.at)
                self._idle_at[role] = s.at
            elif s.at - self._idle_at[role] > c.down_break_s:
                self._down_since[role] = math.inf   # busy for longer than a burst: idle no more
        order = self._repair(s) or self._up(s, wants) or self._down(s, idle)
        if order is not None:
            self._record(order)
        return order

    def done(self, order: ScaleOrder, at: float, ok: bool = True) -> None:
        """`order` ended at `at`: ok, the pool changed (the node serves, is gone, or its drain was
        called off); not ok, nothing changed (the start failed, the drain could not begin, the
        call-off found no drain: the removal it meant to stop then ends on its own, and says so)."""
        if self._in_flight.get(order.role) == order:
            del self._in_flight[order.role]
        self._last_event_at = max(self._last_event_at, at)
        if not ok:
            if order.kind == "add":
                self._failed_at[order.role] = at    # a repair retries after up_cooldown_s
            return
        self.changed_at = max(self.changed_at, at)
        if order.delta > 0:
            self._grown_at[order.role] = at

    def status(self) -> dict:
        """JSON-safe: what each role read last tick, the orders in flight and the last orders."""
        return {"notes": dict(self.notes), "in_flight": [o.to_dict() for o in self._in_flight.values()],
                "orders": [o.to_dict() for o in self.orders],
                "changed_at": self.changed_at if math.isfinite(self.changed_at) else None}

    # -- what the signals say ---------------------------------------------------------------------------
    def _miss_pressure(self, attainment: float | None, samples: int) -> float:
        """The miss share over the allowed one (1.0 at the target); 0 with too few samples."""
        if attainment is None or samples < self.config.min_samples:
            return 0.0
        allowed = 1.0 - self.config.attainment
        misses = 1.0 - attainment
        return misses / allowed if allowed > 0 else (math.inf if misses > 0 else 0.0)

    def _queueing(self, load: RoleLoad) -> bool:
        c = self.config
        return load.waiting_per_node > c.queue_per_node or (load.role.serves_decode and load.kv_used > c.kv_full)

    def _ttft_role(self, s: ScaleSignals) -> Role | None:
        """Where a TTFT shortfall points: the role that prefills, unless decode queues and it does not."""
        prompt = next((r for r in PROMPT_ROLES if r in s.roles), None)
        decode = s.roles.get(Role.DECODE)
        if decode is not None and self._queueing(decode) and (prompt is None or not self._queueing(s.roles[prompt])):
            return Role.DECODE
        return prompt

    def _wants(self, s: ScaleSignals) -> dict[Role, tuple[float, str]]:
        """The roles short now: their pressure and why (every reason pointing to them, largest first)."""
        c = self.config
        found: dict[Role, list[tuple[float, str]]] = {}
        for role in c.roles:
            if (load := s.roles.get(role)) is not None:
                p = load.waiting_per_node / c.queue_per_node
                if p > 1:
                    found.setdefault(role, []).append(
                        (p, f"{load.waiting_per_node:.1f} requests waiting per {role} node > {c.queue_per_node:g}"))
                # Early: what running requests see now, before they finish and count as misses.
                if role.serves_decode and (p := load.step_s / (c.early_share * c.tpot_target_s)) > 1:
                    found.setdefault(role, []).append(
                        (p, f"{role} steps {load.step_s * 1000:.0f} ms > {c.early_share:.0%} of the TPOT target"))
                if role.serves_prefill and (p := load.prompt_wait_s / (c.early_share * c.ttft_target_s)) > 1:
                    found.setdefault(role, []).append(
                        (p, f"prompts wait {load.prompt_wait_s:.2f} s for compute on a {role} node > "
                            f"{c.early_share:.0%} of the TTFT target"))
        slo = s.slo
        ttft = self._miss_pressure(slo.ttft_attainment, slo.samples)
        if ttft > 1 and (prompt := self._ttft_role(s)) is not None:
            refused = f", {slo.rejected} refused" if slo.rejected else ""
            found.setdefault(prompt, []).append(
                (ttft, f"TTFT attainment {slo.ttft_attainment:.0%} < {c.attainment:.0%} over {slo.samples} "
                       f"requests{refused}"))
        tpot = self._miss_pressure(slo.tpot_attainment, slo.tpot_total)
        if tpot > 1 and (decode := next((r for r in DECODE_ROLES if r in s.roles), None)) is not None:
            found.setdefault(decode, []).append(
                (tpot, f"TPOT attainment {slo.tpot_attainment:.0%} < {c.attainment:.0%} over {slo.tpot_total} "
                       f"requests"))
        out = {}
        for role, reasons in found.items():
            reasons.sort(key=lambda pw: -pw[0])
            out[role] = reasons[0][0], "; ".join(why for _, why in reasons)
        return out

    def _idle(self, s: ScaleSignals) -> dict[Role, tuple[float, str]]:
        """The roles that could lose a node now (no role is short): their busy share with one node
        fewer and why."""
        c = self.config
        slo = s.slo
        if max(self._miss_pressure(slo.ttft_attainment, slo.samples),
               self._miss_pressure(slo.tpot_attainment, slo.tpot_total)) > 1:
            return {}                       # a shortfall no scaled role can take still keeps every node
        out = {}
        for r in c.ranges:
            load = s.roles.get(r.role)
            if load is None or load.live <= r.least or load.waiting_per_node > c.queue_per_node / 4:
                continue
            if r.role.serves_decode and load.kv_one_fewer >= c.kv_full:
                continue
            kv = f", KV {load.kv_used:.0%} -> {load.kv_one_fewer:.0%}" if r.role.serves_decode else ""
            busy = load.busy_one_fewer
            if busy < c.idle_share:
                out[r.role] = busy, (f"busy {load.busy_share:.0%} -> {busy:.0%} with one node fewer "
                                     f"(< {c.idle_share:.0%}){kv}, {load.waiting_per_node:.1f} waiting per node")
            elif (fits := self._fits_one_fewer(load)) is not None:
                # A batching engine steps as long as one sequence runs: busy, yet with room. What its
                # requests would see with one node fewer decides then.
                out[r.role] = fits, f"{self._latency_note(load)} with one node fewer{kv}"
        return out

    def _fits_one_fewer(self, load: RoleLoad) -> float | None:
        """For a role that decodes: the larger of its projected step time over the TPOT target and its
        projected prompt wait over the TTFT target (a role that prefills too), when both stay under
        idle_share of them; None when one would not (or nothing is measured)."""
        c = self.config
        if not load.role.serves_decode or load.step_s <= 0:
            return None
        step = load.step_one_fewer / c.tpot_target_s
        wait = load.prompt_wait_one_fewer / c.ttft_target_s if load.role.serves_prefill else 0.0
        worst = max(step, wait)
        return worst if worst < c.idle_share else None

    @staticmethod
    def _latency_note(load: RoleLoad) -> str:
        note = f"steps {load.step_s * 1000:.0f} -> {load.step_one_fewer * 1000:.0f} ms"
        if load.role.serves_prefill:
            note += f", prompt wait {load.prompt_wait_s:.2f} -> {load.prompt_wait_one_fewer:.2f} s"
        return note

    # -- the three rules, in order ----------------------------------------------------------------------
    def _repair(self, s: ScaleSignals) -> ScaleOrder | None:
        """A role below its least, counting nodes starting: one more at once, or a drain called off."""
        c = self.config
        for r in c.ranges:
            load = s.roles.get(r.role)
            if load is None or load.live + load.starting >= r.least:
                continue
            why = f"{load.live} {r.role} nodes live + {load.starting} starting, fewer than {r.least}"
            in_flight = self._in_flight.get(r.role)
            removing = in_flight is not None and in_flight.delta < 0
            draining = load.draining > 0 or removing
            if in_flight is not None and not removing:
                self.notes[r.role.value] = f"{why}; {in_flight.kind} in flight"
            elif not draining and s.at - self._failed_at[r.role] < c.up_cooldown_s:
                self.notes[r.role.value] = (f"{why}; a start failed {s.at - self._failed_at[r.role]:.1f}s ago, "
                                            f"retrying after {c.up_cooldown_s:g}s")
            else:
                return ScaleOrder(r.role, +1, why, s.at, cancel_drain=draining)
        return None

    def _up(self, s: ScaleSignals, wants: dict[Role, tuple[float, str]]) -> ScaleOrder | None:
        c = self.config
        starting = any(o.kind == "add" for o in self._in_flight.values()) or any(
            load.starting > 0 for load in s.roles.values())
        for role, (_, why) in sorted(wants.items(), key=lambda item: -item[1][0]):    # the most pressed first
            held = s.at - self._up_since[role]
            load, most = s.roles[role], self._ranges[role].most
            in_flight = self._in_flight.get(role)
            removing = in_flight is not None and in_flight.delta < 0
            draining = load.draining > 0 or removing
            if held < c.up_hold_s:
                note = f"for {held:.1f}s of {c.up_hold_s:g}s"
            elif in_flight is not None and not removing:
                note = f"{in_flight.kind} in flight"
            elif draining:
                return ScaleOrder(role, +1, f"{why}, for {held:.1f}s: a drain called off", s.at, cancel_drain=True)
            elif load.live + load.starting >= most:
                note = f"at its most ({most} nodes): cannot grow"
            elif starting:
                note = "waits for the node starting"
            elif s.at - (last := max(self._grown_at[role], self._failed_at[role])) < c.up_cooldown_s:
                note = f"cooling down: last addition ended {s.at - last:.1f}s ago of {c.up_cooldown_s:g}s"
            else:
                return ScaleOrder(role, +1, f"{why}, for {held:.1f}s", s.at)
            self.notes[role.value] = f"short: {why}; {note}"
        return None

    def _down(self, s: ScaleSignals, idle: dict[Role, tuple[float, str]]) -> ScaleOrder | None:
        c = self.config
        blockers = [f"{load.role} {'starting' if load.starting else 'draining'}" for load in s.roles.values()
                    if load.starting or load.draining] + [f"{o.kind} {o.role} in flight"
                                                          for o in self._in_flight.values()]
        since = s.at - self._last_event_at
        for role, (_, why) in sorted(idle.items(), key=lambda item: (item[1][0], item[0].value)):   # the idlest first
            held = s.at - self._down_since[role]
            if held < c.down_hold_s:
                note = f"for {held:.1f}s of {c.down_hold_s:g}s"
            elif blockers:
                note = f"waits: {', '.join(blockers)}"
            elif since < c.down_cooldown_s:
                note = f"cooling down: last order {since:.1f}s ago of {c.down_cooldown_s:g}s"
            else:
                return ScaleOrder(role, -1, f"{why}, for {held:.1f}s", s.at)
            self.notes[role.value] = f"idle: {why}; {note}"
        return None

    def _record(self, order: ScaleOrder) -> None:
        self._in_flight[order.role] = order         # a call-off replaces the role's removal
        self._last_event_at = max(self._last_event_at, order.at)
        self._up_since[order.role] = math.inf
        self._down_since = {r: math.inf for r in self._down_since}
        self.orders.append(order)
        del self.orders[:-64]

    def _slo_note(self, slo: SloCounts) -> str:
        c = self.config
        ttft, tpot = slo.ttft_attainment, slo.tpot_attainment
        return (f"TTFT {'-' if ttft is None else f'{ttft:.0%}'} over {slo.samples} requests "
                f"({slo.rejected} refused), TPOT {'-' if tpot is None else f'{tpot:.0%}'} over {slo.tpot_total}; "
                f"target {c.attainment:.0%}, judged from {c.min_samples} requests")


def _per_node(total: float, nodes: int) -> float:
    if nodes > 0:
        return total / nodes
    return math.inf if total > 0 else 0.0


def _one_fewer(share: float, nodes: int) -> float:
    """A mean share over `nodes` spread over one node fewer (from one to none: only nothing fits)."""
    if nodes > 1:
        return share * nodes / (nodes - 1)
    return math.inf if share > 0 else 0.0
