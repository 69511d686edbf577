"""PoolScaler: the node pool's autoscaler. Every tick_s it measures each scaled role (from the
supervisor's probes: nodes by state, their step time, queues, KV use) and the SLO counts the ingress
replicas sent in (report_slo), asks the ScalePolicy (policy.py) for an order, and carries it out:

    +1  start a node of the role (NodeCluster.add_nodes: a Ray actor asking for the node's CPUs and
        GPUs, so on a Ray cluster with an autoscaler - KubeRay - the request for resources is what
        brings a machine); once it is ready and attached to the Conductor, the supervisor watches it
        and the ingress replicas see it in the next membership
    +1 with cancel_drain: call a running drain of the role off instead (cheaper than a new node)
    -1  drain the role's lightest live node (node_drain.py) and remove it once idle: no request lost

Who decides what, with flex nodes (--adaptive): this scaler owns how many flex nodes there are, the
Conductor's duty planner which duty each has. A new flex node starts in the duty the shortfall asks
for (TPOT: decode, else prefill); the duty planner never moves a retiring node and the Conductor
refuses to retire the last node of a duty; and an addition waits while a duty change is draining,
since moving a node is cheaper than starting one (the policy's up_hold_s is longer than the duty
planner's hold plus its cooldown, so the planner gets the first try).
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray

from raypd.cluster.autoscale.config import AutoscaleConfig
from raypd.cluster.autoscale.node_drain import DrainPhase, NodeDrain
from raypd.cluster.autoscale.policy import RoleLoad, ScaleOrder, ScalePolicy, ScaleSignals
from raypd.cluster.autoscale.slo_counts import SloCounts, SloWindow
from raypd.cluster.client.membership import Member, MemberState
from raypd.cluster.client.node_handles import NodeHandle
from raypd.cluster.launch.local_cluster import NodeCluster
from raypd.cluster.serve.supervisor import NodeSupervisor
from raypd.protocol.duty import Duty
from raypd.protocol.messages import LoadReport
from raypd.protocol.roles import Role

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Busy:
    """A node's last report time and summed step time: two reports give its busy share."""
    at: float
    step_s_total: float
    share: float = 0.0


def _prompt_wait_s(load: LoadReport) -> float:
    """How long a new prompt waits for compute on the node: its queued prompt tokens at its speed."""
    return load.queued_prefill_tokens / load.prefill_tokens_per_s if load.prefill_tokens_per_s > 0 else 0.0


class PoolScaler:
    def __init__(self, config: AutoscaleConfig, cluster: NodeCluster, supervisor: NodeSupervisor,
                 conductor: Any = None, clock: Callable[[], float] = time.monotonic,
                 kill: Callable[[Any], None] = ray.kill):
        """`kill`: ends a node actor for good (ray.kill; tests pass a double)."""
        self.config = config
        self.cluster = cluster
        self.supervisor = supervisor
        self.conductor = conductor
        self.clock = clock
        self.kill = kill
        self.policy = ScalePolicy(config)
        self.window = SloWindow(config.window_s)
        self._busy: dict[str, _Busy] = {}
        self._step_base: dict[Role, float] = {}   # per role: the shortest step seen with something running
        self._starting: dict[Role, int] = {}
        self._drains: dict[str, NodeDrain] = {}
        self._tasks: set[asyncio.Task] = set()
        self._loop_task: asyncio.Task | None = None
        self._stopped = False
        self.last_error = ""

    # -- for the node pool --------------------------------------------------------------------------
    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        """No more orders; a node still starting is killed as soon as it is up (_start_node)."""
        self._stopped = True
        for task in [self._loop_task, *self._tasks]:
            if task is not None:
                task.cancel()

    def report_slo(self, counts: SloCounts) -> None:
        """An ingress replica's counts since its last report."""
        self.window.add(self.clock(), counts)

    def status(self) -> dict:
        roles = {}
        for rng in self.config.ranges:
            members = self._members(rng.role)
            roles[rng.role.value] = {
                "live": sum(m.state is MemberState.LIVE for m in members),
                "draining": sum(m.state is MemberState.DRAINING for m in members),
                "starting": self._starting.get(rng.role, 0), "least": rng.least, "most": rng.most}
        slo = self.window.over(self.clock(), since=self.policy.changed_at)
        return {"roles": roles, "notes": dict(self.policy.notes),
                "slo": {"ttft_attainment": slo.ttft_attainment, "tpot_attainment": slo.tpot_attainment,
                        "samples": slo.samples, "window_s": self.config.window_s,
                        "ttft_target_s": self.config.ttft_target_s, "tpot_target_s": self.config.tpot_target_s,
                        "attainment_target": self.config.attainment},
                "orders": [o.to_dict() for o in self.policy.orders[-16:]],
                **({"last_error": self.last_error} if self.last_error else {})}

    # -- one round --------------------------------------------------------------------------------
    async def tick(self) -> ScaleOrder | None:
        """Measure, decide, and start carrying the order out (it runs on in the background)."""
        now = self.clock()
        self._forget_dead()
        signals = ScaleSignals(at=now, slo=self.window.over(now, since=self.policy.changed_at),
                               roles={r.role: self._role_load(r.role) for r in self.config.ranges})
        order = None if self._duty_change_draining() else self.policy.decide(signals)
        if order is not None:
            log.info("autoscaler: %s %s (%s)", "add" if order.delta > 0 else "remove", order.role, order.reason)
            self._spawn(self._carry_out(order, signals))
        self.supervisor.publish(self.status())
        return order

    def signals(self) -> dict[Role, RoleLoad]:
        """What the policy sees of each role now (for status and tests)."""
        return {r.role: self._role_load(r.role) for r in self.config.ranges}

    # -- internals --------------------------------------------------------------------------------
    async def _run(self) -> None:
        while not self._stopped:
            try:
                await self.tick()
            except Exception as e:  # noqa: BLE001 - the scaler must outlive any one bad round
                log.exception("autoscaler round failed")
                self.last_error = f"{type(e).__name__}: {e}"
            await asyncio.sleep(self.config.tick_s)

    def _members(self, role: Role) -> list[Member]:
        return [m for m in self.supervisor.membership().members if m.node.role is role]

    def _role_load(self, role: Role) -> RoleLoad:
        members = self._members(role)
        live = [m for m in members if m.state is MemberState.LIVE]
        shares, waiting, kv, steps, waits = [], 0.0, [], [], []
        for m in live:
            if m.load is None:
                continue
            shares.append(self._busy_share(m))
            waits.append(_prompt_wait_s(m.load))
            if m.load.running > 0 and m.load.step_time_s > 0:
                steps.append(m.load.step_time_s)
            # A decode node's waiting counts its transfers too (KV on its way from a prefill node):
            # those wait for the prefill side, not for this role's capacity.
            waiting += m.load.waiting - (m.load.inflight if role is Role.DECODE else 0)
            if m.load.total_blocks:
                kv.append(1.0 - m.load.free_blocks / m.load.total_blocks)
        if steps:
            self._step_base[role] = min(self._step_base.get(role, math.inf), *steps)
        return RoleLoad(role=role, live=len(live), starting=self._starting.get(role, 0),
                        # Its own drains only: an operator's (NodePool.drain_node) is a node leaving for
                        # good, which the policy must not call off, nor count as a node it still has.
                        draining=sum(m.state is MemberState.DRAINING and m.name in self._drains for m in members),
                        busy_share=sum(shares) / len(shares) if shares else 0.0, waiting=waiting,
                        kv_used=sum(kv) / len(kv) if kv else 0.0,
                        step_s=sum(steps) / len(steps) if steps else 0.0, step_base_s=self._step_base.get(role, 0.0),
                        prompt_wait_s=sum(waits) / len(waits) if waits else 0.0)

    def _busy_share(self, m: Member) -> float:
        """The share of wall time the node's engine stepped between its last two reports."""
        load = m.load
        assert load is not None
        last = self._busy.get(m.name)
        if last is None or load.timestamp < last.at:   # first report, or a restarted node
            self._busy[m.name] = _Busy(load.timestamp, load.step_s_total)
            return 0.0
        if load.timestamp > last.at:
            span = load.timestamp - last.at
            share = min(1.0, max(0.0, load.step_s_total - last.step_s_total) / span)
            self._busy[m.name] = _Busy(load.timestamp, load.step_s_total, share)
            return share
        return last.share

    def _duty_change_draining(self) -> bool:
        """A flex node is moving between duties: the duty planner is fixing the mix; wait for it."""
        for m in self.supervisor.membership().members:
            if m.node.role is Role.FLEX and m.state is MemberState.LIVE and m.load is not None and m.load.duty:
                if Duty.parse(m.load.duty).draining is not None:
                    return True
        return False

    def _forget_dead(self) -> None:
        """A scaled role's node dead for good (its restarts used up) leaves the membership: the
        policy sees the role short and replaces it."""
        for m in self.supervisor.membership().members:
            if m.state is MemberState.DEAD and self.config.range_of(m.node.role) is not None:
                log.warning("autoscaler: node %s is dead for good (%s); dropping it", m.name, m.reason)
                self.supervisor.remove(m.name)
                self.cluster.remove(m.node)
                self._busy.pop(m.name, None)

    async def _carry_out(self, order: ScaleOrder, signals: ScaleSignals) -> None:
        ok = False
        try:
            if order.delta > 0 and order.cancel_drain:
                ok = self._call_off_drain(order.role)
            elif order.delta > 0:
                await self._start_node(order.role, self._first_duty(order, signals))
                ok = True
            else:
                await self._drain_lightest(order.role)
                ok = True
        except Exception as e:  # noqa: BLE001 - recorded; the policy may order again after its cooldown
            self.last_error = f"{order.role} {order.delta:+d}: {type(e).__name__}: {e}"
            log.warning("autoscaler: %s", self.last_error)
        finally:
            self.policy.done(order, self.clock(), ok)
            self.supervisor.publish(self.status())

    def _first_duty(self, order: ScaleOrder, signals: ScaleSignals) -> Duty | None:
        if order.role is not Role.FLEX:
            return None
        tpot = signals.slo.tpot_attainment
        return Duty.DECODE if tpot is not None and tpot < self.config.attainment else Duty.PREFILL

    async def _start_node(self, role: Role, duty: Duty | None) -> None:
        self._starting[role] = self._starting.get(role, 0) + 1
        try:
            handles = await asyncio.to_thread(self._add_nodes, role, duty)
        finally:
            self._starting[role] -= 1
        if self._stopped:
            return
        self.supervisor.add(handles)
        log.info("autoscaler: node %s is up", ", ".join(h.name for h in handles))

    def _add_nodes(self, role: Role, duty: Duty | None) -> list[NodeHandle]:
        """On a worker thread: blocks while the node loads its model (or Ray finds it resources)."""
        handles = self.cluster.add_nodes([role], duties=[duty] if duty is not None else None)
        if self._stopped:   # the pool went away meanwhile: its cluster.stop() may have missed these
            for h in handles:
                self.kill(h.actor)
        return handles

    async def _drain_lightest(self, role: Role) -> None:
        live = [m for m in self._members(role) if m.state is MemberState.LIVE and m.name not in self._drains]
        if len(live) < 2:
            raise RuntimeError(f"no {role} node to spare ({len(live)} live)")
        # The one holding the fewest requests drains soonest; on a tie the newest (its cache is the coldest).
        victim = min(reversed(live), key=lambda m: m.load.running + m.load.waiting if m.load else 0)
        drain = NodeDrain(victim.node, self.supervisor, self.conductor, self.cluster.remove,
                          drain_timeout_s=self.config.drain_timeout_s, kill=self.kill)
        self._drains[victim.name] = drain
        try:
            phase = await drain.run()
        finally:
            self._drains.pop(victim.name, None)
            self._busy.pop(victim.name, None)
        if phase is not DrainPhase.REMOVED:
            raise RuntimeError(f"drain of {victim.name} {phase.name.lower()}: {drain.reason}")

    def _call_off_drain(self, role: Role) -> bool:
        for drain in self._drains.values():
            if drain.node.role is role and not drain.phase.ended:
                drain.call_off()
                return True
        return False

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
