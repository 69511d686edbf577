"""The pool's side of scaling with actor doubles (real actors: test_autoscale_serve.py): the
supervisor's DRAINING state, NodeSet readers that must not end a draining node's streams, a
NodeDrain's every ending, and the PoolScaler carrying the policy's orders out."""
from __future__ import annotations

import asyncio

import pytest

from raypd.cluster.autoscale.config import AutoscaleConfig, RoleRange
from raypd.cluster.autoscale.node_drain import DrainPhase, NodeDrain
from raypd.cluster.autoscale.pool_scaler import PoolScaler
from raypd.cluster.autoscale.slo_counts import SloCounts
from raypd.cluster.client.membership import MemberState
from raypd.cluster.client.node_handles import NodeHandle
from raypd.cluster.client.node_set import NodeSet
from raypd.cluster.serve.supervisor import NodeSupervisor
from raypd.conductor.errors import RetireRefused
from raypd.protocol.roles import Role
from tests.serve.test_membership import HOST, FakeConductor, FakeNode, Method


class DrainableNode(FakeNode):
    """A node double that holds `busy` requests for its next check_idle calls (one fewer each)."""

    def __init__(self, name: str, role: Role = Role.MIXED, busy: int = 0):
        super().__init__(name, role)
        self.busy = busy
        self.check_idle = Method(self._check_idle)
        self.shutdown = Method(lambda: None)

    def _check_idle(self) -> dict:
        held = {"requests": self.busy, "reservations": 0, "streams": self.busy}
        self.busy = max(0, self.busy - 1)
        return held


class RetiringConductor(FakeConductor):
    def __init__(self, refuse: bool = False):
        super().__init__()
        self.retired: list[tuple] = []

        def retire(name, retiring=True):
            if refuse and retiring:
                raise RetireRefused(f"{name} is the last node to decode")
            self.retired.append((name, retiring))
        self.retire_node = Method(retire)


def handle(node: DrainableNode) -> NodeHandle:
    return NodeHandle(node.name, node.role, node, HOST, 64)


def run(coro):
    return asyncio.run(coro)


def test_a_draining_node_stays_draining_through_its_probes_and_leaves_routing_but_not_its_streams():
    async def scenario():
        a, b = DrainableNode("m0"), DrainableNode("m1")
        sup = NodeSupervisor([handle(a), handle(b)])
        nodes = NodeSet(sup.membership(), fetch=lambda: _now(sup.membership()))
        left: list[tuple] = []
        nodes.on_leave(lambda name, state: left.append((name, state)))
        await sup.probe_round()
        sup.drain("m1")
        await sup.probe_round()
        await nodes.refresh()
        assert sup.membership().by_name["m1"].state is MemberState.DRAINING
        assert [n.name for n in nodes.live()] == ["m0"] and left == []
        sup.undrain("m1")
        await sup.probe_round()
        assert sup.membership().by_name["m1"].state is MemberState.LIVE
        sup.drain("m1")
        await nodes.refresh()
        b.error = asyncio.TimeoutError()      # a draining node that stops answering has left
        await sup.probe_round()
        await nodes.refresh()
        assert left == [("m1", MemberState.UNRESPONSIVE)]
        sup.remove("m1")
        await nodes.refresh()
        assert [m.name for m in nodes.membership.members] == ["m0"]
    run(scenario())


async def _now(value):
    return value


def test_a_drain_waits_for_two_idle_checks_then_removes_the_node_everywhere():
    async def scenario():
        a, b = DrainableNode("m0"), DrainableNode("m1", busy=3)
        conductor = RetiringConductor()
        sup = NodeSupervisor([handle(a), handle(b)], conductor)
        await sup.probe_round()
        forgotten: list[str] = []
        killed: list = []
        drain = NodeDrain(sup.membership().by_name["m1"].node, sup, conductor, lambda n: forgotten.append(n.name),
                          poll_s=0.01, confirm_s=0.05, kill=killed.append)
        assert await drain.run() is DrainPhase.REMOVED
        assert b.busy == 0 and len(b.check_idle.calls) >= 5   # 3 busy answers, then idle twice confirm_s apart
        assert conductor.retired == [("m1", True)] and conductor.mark_dead.calls[-1][0] == "m1"
        assert b.shutdown.calls and killed == [b] and forgotten == ["m1"] and "m1" not in sup.membership().by_name
    run(scenario())


def test_a_refused_retirement_keeps_the_node_and_a_drain_that_never_idles_is_called_off():
    async def scenario():
        a, b = DrainableNode("m0"), DrainableNode("m1", busy=10**6)
        sup = NodeSupervisor([handle(a), handle(b)], RetiringConductor(refuse=True))
        await sup.probe_round()
        drain = NodeDrain(sup.membership().by_name["m1"].node, sup, sup.conductor, lambda n: None, poll_s=0.01,
                          kill=_no_kill)
        assert await drain.run() is DrainPhase.REFUSED and "last node to decode" in drain.reason
        assert sup.membership().by_name["m1"].state is MemberState.LIVE

        conductor = RetiringConductor()
        sup = NodeSupervisor([handle(a), handle(b)], conductor)
        await sup.probe_round()
        drain = NodeDrain(sup.membership().by_name["m1"].node, sup, conductor, lambda n: None,
                          drain_timeout_s=0.1, poll_s=0.01, kill=_no_kill)
        assert await drain.run() is DrainPhase.CALLED_OFF and "still busy" in drain.reason
        assert conductor.retired == [("m1", True), ("m1", False)]
        assert sup.membership().by_name["m1"].state is MemberState.LIVE and not b.shutdown.calls
    run(scenario())


class FakeCluster:
    """NodeCluster's add_nodes / remove, starting node doubles."""

    def __init__(self, nodes: list[DrainableNode]):
        self.nodes = [handle(n) for n in nodes]
        self.started: list[tuple] = []

    def add_nodes(self, roles, duties=None):
        self.started.append((tuple(roles), duties))
        node = DrainableNode(f"m{len(self.nodes)}", Role.parse(roles[0]))
        self.nodes.append(handle(node))
        return [self.nodes[-1]]

    def remove(self, node: NodeHandle) -> None:
        self.nodes = [n for n in self.nodes if n.name != node.name]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_scaler_adds_a_node_on_missed_targets_and_drains_one_away_when_idle():
    async def scenario():
        cluster = FakeCluster([DrainableNode("m0")])
        sup = NodeSupervisor(list(cluster.nodes), RetiringConductor())
        clock = Clock()
        config = AutoscaleConfig((RoleRange(Role.MIXED, 1, 2),), ttft_target_s=1.0, tpot_target_s=0.1,
                                 up_hold_s=0, up_cooldown_s=0, down_hold_s=4, down_cooldown_s=0, min_samples=4)
        killed: list = []
        scaler = PoolScaler(config, cluster, sup, sup.conductor, clock=clock,   # type: ignore[arg-type]
                            kill=killed.append)
        await sup.probe_round()
        scaler.report_slo(SloCounts(ttft_met=1, ttft_total=5))           # 1 of 5 met TTFT
        order = await scaler.tick()
        assert order is not None and (order.role, order.delta) == (Role.MIXED, 1)
        await _settle(scaler)
        assert cluster.started == [((Role.MIXED,), None)]
        assert [m.name for m in sup.membership().members] == ["m0", "m1"]
        assert await scaler.tick() is None                               # at most: no more
        await sup.probe_round()
        removed = None
        for _ in range(6):                                               # idle (no samples, busy 0) for the hold
            clock.t += 2
            removed = removed or await scaler.tick()
            await _settle(scaler)
        assert removed is not None and removed.delta == -1
        assert [m.name for m in sup.membership().members] == ["m0"] and [n.name for n in cluster.nodes] == ["m0"]
        assert [k.name for k in killed] == ["m1"]
        status = sup.membership().health()["autoscale"]
        assert status["roles"]["mixed"] == {"live": 1, "draining": 0, "starting": 0, "least": 1, "most": 2}
        assert [o["delta"] for o in status["orders"]] == [1, -1]
    run(scenario())


def _no_kill(actor) -> None:
    pytest.fail(f"{actor.name} must not be killed")


async def _settle(scaler: PoolScaler) -> None:
    """Until the orders the scaler started ended (drains poll every second: at most a few)."""
    for _ in range(100):
        if not scaler._tasks:
            return
        await asyncio.sleep(0.05)
    pytest.fail("the scaler's order did not end")
