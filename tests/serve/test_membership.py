"""Membership, the node pool's supervisor and the routers that read them, with actor doubles: the
states a probe's outcome leads to, what the Conductor is told, re-attachment of a restarted node,
readiness, and the ConductorRouter's local fallback. (Real actors die in tests/cluster.)"""
from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
import ray.exceptions

from raypd.cluster.client.conductor_router import ConductorRouter
from raypd.cluster.client.local_router import LocalRouter
from raypd.cluster.client.membership import Member, Membership, MemberState
from raypd.cluster.client.node_handles import NodeHandle
from raypd.cluster.client.node_set import NodeSet
from raypd.cluster.client.router import NoNodeError, RoundRobinRouter
from raypd.cluster.serve.supervisor import NodeSupervisor
from raypd.conductor.errors import AdmissionRejected
from raypd.protocol.messages import HostInfo, LoadReport
from raypd.protocol.roles import Role

HOST = HostInfo("n0", "127.0.0.1", "localhost", 0)


def load(name: str, role: Role, running: int = 0) -> LoadReport:
    return LoadReport(node_name=name, role=role, queued_prefill_tokens=0, waiting=0, running=running,
                      free_blocks=64, total_blocks=64, cached_blocks=0, timestamp=1.0)


class Method:
    """`actor.method.remote(...)` returning an awaitable that runs `fn`."""

    def __init__(self, fn):
        self.fn = fn
        self.calls: list[tuple] = []

    def remote(self, *args):
        self.calls.append(args)

        async def run():
            return self.fn(*args)
        return run()


class FakeNode:
    def __init__(self, name: str, role: Role):
        self.name, self.role = name, role
        self.instance = "a"
        self.error: BaseException | None = None
        self.ready = Method(self._ready)
        self.stalled_s = 0.0   # how long its engine's current turn has run, as its published load says
        self.published_load = Method(lambda: replace(load(name, role, 1), stalled_s=self.stalled_s))
        self.attach_conductor = Method(lambda conductor: None)
        self.admit_error: BaseException | None = None
        self.admit_peers = Method(self._admit_peers)

    def _ready(self):
        if self.error is not None:
            raise self.error
        return {"instance_id": self.instance, "host": HOST, "num_blocks": 64, "bootstrap_address": f"tcp://{self.instance}",
                "public_key": f"key-{self.name}"}

    def _admit_peers(self, keys: dict) -> int:
        if self.admit_error is not None:
            raise self.admit_error
        return len(keys)


class FakeConductor:
    def __init__(self):
        self.instance = "c1"
        self.error: BaseException | None = None
        self.decision: tuple[str, str] | None = None
        self.status = Method(self._status)
        self.mark_dead = Method(lambda name, reason: True)
        self.route = Method(self._route)
        self.report_delivered = Method(lambda *a: None)

    def _status(self):
        if self.error is not None:
            raise self.error
        return {"instance_id": self.instance}

    def _route(self, request_id, ids, hashes, exclude, priority):
        if self.error is not None:
            raise self.error

        class D:
            prefill_node, decode_node = self.decision
            path = "split"
        return D()


def handle(fake: FakeNode) -> NodeHandle:
    return NodeHandle(fake.name, fake.role, fake, HOST, 64, "tcp://a")


def cluster():
    nodes = [FakeNode("p0", Role.PREFILL), FakeNode("d0", Role.DECODE), FakeNode("d1", Role.DECODE)]
    return nodes, FakeConductor()


def test_probe_outcomes_move_nodes_between_states_and_tell_the_conductor():
    async def run():
        (p0, d0, d1), conductor = cluster()
        sup = NodeSupervisor([handle(n) for n in (p0, d0, d1)], conductor, probe_timeout_s=1)
        m = await sup.probe_round()
        assert [x.state for x in m.members] == [MemberState.LIVE] * 3 and m.conductor_state is MemberState.LIVE
        d0.error = ray.exceptions.ActorUnavailableError("restarting", None)
        m = await sup.probe_round()
        assert m.by_name["d0"].state is MemberState.RESTARTING and m.can_serve
        assert [c[0] for c in conductor.mark_dead.calls] == ["d0"]          # told at once, once
        await sup.probe_round()
        assert len(conductor.mark_dead.calls) == 1
        d0.error, d0.instance = None, "b"                                    # Ray restarted it
        m = await sup.probe_round()
        await asyncio.sleep(0)                                               # the attachment's task starts
        d0m = m.by_name["d0"]
        assert (d0m.state, d0m.incarnation, d0m.restarts) == (MemberState.LIVE, 1, 1)
        assert d0m.node.bootstrap_address == "tcp://b"                       # the new incarnation's handle
        assert d0.attach_conductor.calls == [(conductor,)]                   # re-attached to the Conductor
        p0.error = ray.exceptions.ActorDiedError()
        m = await sup.probe_round()
        # No prefill node: still servable, the decode nodes prefill for themselves (the local path).
        assert m.by_name["p0"].state is MemberState.DEAD and m.can_serve
        d0.error = d1.error = ray.exceptions.ActorDiedError()
        m = await sup.probe_round()
        assert not m.can_serve and m.health()["status"] == "unavailable"
        assert m.version > 0
    asyncio.run(run())


def test_a_restarted_node_takes_every_peers_key_before_it_is_routed_again():
    """Ray rebuilds a restarted node from its old constructor arguments, whose allow-list may predate
    nodes added since (kvtransfer/identity.py): the supervisor hands it the whole list first, and a
    node that does not take it stays out of routing until it does."""
    async def run():
        (p0, d0, d1), conductor = cluster()
        sup = NodeSupervisor([replace(handle(n), public_key=f"key-{n.name}") for n in (p0, d0, d1)], conductor,
                             probe_timeout_s=1)
        await sup.probe_round()
        assert d0.admit_peers.calls == []                                    # nothing to hand a node that never left
        d0.instance, d0.admit_error = "b", ConnectionError("not yet")        # Ray restarted it; the call fails
        m = await sup.probe_round()
        assert m.by_name["d0"].state is not MemberState.LIVE and m.by_name["d0"].incarnation == 0
        d0.admit_error = None
        m = await sup.probe_round()                                          # the next probe hands it over again
        assert (m.by_name["d0"].state, m.by_name["d0"].incarnation) == (MemberState.LIVE, 1)
        assert d0.admit_peers.calls[-1] == ({"p0": "key-p0", "d0": "key-d0", "d1": "key-d1"},)
        assert m.by_name["d0"].node.public_key == "key-d0"                   # the new incarnation's, from ready()
    asyncio.run(run())


def test_conductor_restart_is_seen_and_counted():
    async def run():
        nodes, conductor = cluster()
        sup = NodeSupervisor([handle(n) for n in nodes], conductor)
        await sup.probe_round()
        conductor.error = ray.exceptions.ActorUnavailableError("restarting", None)
        assert (await sup.probe_round()).conductor_state is MemberState.RESTARTING
        conductor.error, conductor.instance = None, "c2"
        m = await sup.probe_round()
        assert (m.conductor_state, m.conductor_incarnation) == (MemberState.LIVE, 1)
        assert m.health()["conductor"] == {"state": "live", "incarnation": 1}
    asyncio.run(run())


def membership(conductor_state=MemberState.LIVE, **states) -> tuple[Membership, FakeConductor]:
    (p0, d0, d1), conductor = cluster()
    members = tuple(Member(handle(n), states.get(n.name, MemberState.LIVE),
                           load=load(n.name, n.role, 9 if n.name == "d0" else 0))
                    for n in (p0, d0, d1))
    return Membership(1, members, conductor, conductor_state), conductor


def test_routers_use_only_live_nodes_minus_excluded():
    async def run():
        m, _ = membership(d1=MemberState.RESTARTING)
        nodes = NodeSet(m)
        for router in (RoundRobinRouter(nodes), LocalRouter(nodes)):
            for _ in range(5):
                r = await router.route("r", [1, 2, 3])
                assert (r.prefill.name, r.decode.name) == ("p0", "d0")
            with pytest.raises(NoNodeError):
                await router.route("r", [1], exclude=frozenset({"d0"}))
    asyncio.run(run())


def test_local_router_sends_requests_to_a_decode_node_alone_while_no_prefill_node_lives():
    async def run():
        m, _ = membership(p0=MemberState.DEAD)
        router = LocalRouter(NodeSet(m))
        routes = [await router.route("r", [1, 2, 3]) for _ in range(4)]
        assert all(r.decode is None and r.prefill.role == Role.DECODE for r in routes)
        with pytest.raises(NoNodeError):
            await router.route("r", [1], exclude=frozenset({"d0", "d1"}))
    asyncio.run(run())


def test_local_router_prefers_the_less_loaded_node():
    async def run():
        m, _ = membership()
        router = LocalRouter(NodeSet(m))
        picks = [(await router.route("r", [1])).decode.name for _ in range(4)]
        # d0 reports 9 running, d1 none: d1 wins every pairwise comparison until it has 9 routed.
        assert picks == ["d1"] * 4
    asyncio.run(run())


def test_conductor_router_falls_back_while_the_conductor_is_away():
    async def run():
        m, conductor = membership()
        conductor.decision = ("p0", "d0")
        router = ConductorRouter(conductor, NodeSet(m), timeout_s=1, away_s=60)
        assert (await router.route("r", [1])).decode.name == "d0" and router.num_fallbacks == 0
        conductor.error = ray.exceptions.ActorDiedError()
        assert (await router.route("r", [1])).decode.name in ("d0", "d1") and router.num_fallbacks == 1
        calls = len(conductor.route.calls)
        await router.route("r", [1])                        # within away_s: not even asked
        assert len(conductor.route.calls) == calls and router.num_fallbacks == 2
        # The pool's probe says it is restarting: routed locally without asking.
        m2, _ = membership(conductor_state=MemberState.RESTARTING)
        router2 = ConductorRouter(conductor, NodeSet(m2))
        await router2.route("r", [1])
        assert len(conductor.route.calls) == calls and router2.num_fallbacks == 1
    asyncio.run(run())


def test_conductor_router_passes_exclusions_and_admission_rejections():
    async def run():
        m, conductor = membership(d0=MemberState.DEAD)
        conductor.decision = ("p0", "d0")                   # a node this caller sees dead
        router = ConductorRouter(conductor, NodeSet(m))
        r = await router.route("r", [1], exclude=frozenset({"x"}))
        assert r.decode.name == "d1" and router.num_fallbacks == 1
        assert conductor.route.calls[-1][3] == ["x"]
        conductor.error = AdmissionRejected("r", "ttft", 3.0, 1.0)
        with pytest.raises(AdmissionRejected):
            await router.route("r", [1])
    asyncio.run(run())


def test_health_body_lists_states():
    m, _ = membership(d0=MemberState.RESTARTING)
    m = replace(m, members=tuple(replace(x, reason="restarting") if x.name == "d0" else x for x in m.members))
    body = m.health()
    assert body["status"] == "ok"
    assert [(n["name"], n["state"]) for n in body["nodes"]] == [("p0", "live"), ("d0", "restarting"), ("d1", "live")]


def test_node_set_tells_its_listeners_about_restarts():
    async def run():
        m1, _ = membership()
        m2 = replace(m1, version=2, members=tuple(replace(x, incarnation=1) if x.name == "d1" else x
                                                  for x in m1.members))

        async def fetch():
            return m2
        nodes = NodeSet(m1, fetch)
        restarted: list[str] = []
        nodes.on_restart(restarted.append)
        await nodes.refresh()
        assert restarted == ["d1"] and nodes.membership is m2
        await nodes.refresh()
        assert restarted == ["d1"]            # told once per new incarnation
    asyncio.run(run())


def test_node_set_tells_its_listeners_when_a_live_node_leaves():
    async def run():
        m1, _ = membership()
        m2 = replace(m1, version=2, members=tuple(replace(x, state=MemberState.UNRESPONSIVE) if x.name == "d0" else x
                                                  for x in m1.members))

        async def fetch():
            return m2
        nodes = NodeSet(m1, fetch)
        left: list[tuple[str, MemberState]] = []
        nodes.on_leave(lambda name, state: left.append((name, state)))
        await nodes.refresh()
        await nodes.refresh()
        assert left == [("d0", MemberState.UNRESPONSIVE)]   # once, on the transition
    asyncio.run(run())


def test_a_stalled_engine_leaves_routing_and_comes_back_when_its_step_ends():
    """Through the watch loops production runs (start()), not probe_round(): a node that answers its
    probes but whose engine turn has run past the stall timeout is UNRESPONSIVE (the Conductor told);
    a long turn below the timeout costs nothing; when the turn ends the node is LIVE again."""
    async def until(sup, name, state):
        for _ in range(200):
            if sup.membership().by_name[name].state is state:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{name} never {state}: {sup.membership().by_name[name]}")

    async def run():
        (p0, d0, d1), conductor = cluster()
        sup = NodeSupervisor([handle(n) for n in (p0, d0, d1)], conductor, probe_interval_s=0.01,
                             probe_timeout_s=1, stall_timeout_s=30)
        sup.start()
        try:
            await until(sup, "d0", MemberState.LIVE)
            d0.stalled_s = 29.0                       # a long step: still live
            await asyncio.sleep(0.1)
            assert sup.membership().by_name["d0"].state is MemberState.LIVE and not conductor.mark_dead.calls
            d0.stalled_s = 31.0                       # past the timeout: hung
            await until(sup, "d0", MemberState.UNRESPONSIVE)
            member = sup.membership().by_name["d0"]
            assert "engine step has run for 31 s" in member.reason
            assert [n.name for n in sup.membership().live(Role.DECODE)] == ["d1"]
            assert [c[0] for c in conductor.mark_dead.calls] == ["d0"]
            d0.stalled_s = 0.0                        # the step ended
            await until(sup, "d0", MemberState.LIVE)
            assert sup.membership().by_name["d0"].incarnation == 0   # the same instance, not a restart
        finally:
            sup.stop()
    asyncio.run(run())


def test_a_restarted_node_serves_while_its_attachment_to_the_conductor_is_retried():
    """The Conductor is away when Ray restarts a node: the node is LIVE as its new incarnation at once
    (the local fallback router can use it), and the attachment is retried in the background until it
    takes, without holding up the node's watch loop."""
    async def run():
        (p0, d0, d1), conductor = cluster()
        failures = [ray.exceptions.ActorUnavailableError("the Conductor is restarting", None)] * 3

        def attach(_conductor):
            if failures:
                raise failures.pop()
        d0.attach_conductor = Method(attach)
        sup = NodeSupervisor([handle(n) for n in (p0, d0, d1)], conductor, probe_interval_s=0.01,
                             probe_timeout_s=1, attach_timeout_s=1)
        sup.start()
        try:
            while sup.membership().by_name["d0"].load is None:               # the first instance is known
                await asyncio.sleep(0.01)
            d0.instance = "b"                                                # Ray restarted it
            for _ in range(200):
                if sup.membership().by_name["d0"].incarnation == 1:
                    break
                await asyncio.sleep(0.01)
            d0m = sup.membership().by_name["d0"]
            assert (d0m.state, d0m.incarnation, d0m.node.bootstrap_address) == (MemberState.LIVE, 1, "tcp://b")
            for _ in range(200):
                if not failures and len(d0.attach_conductor.calls) == 4:
                    break
                await asyncio.sleep(0.01)
            assert d0.attach_conductor.calls == [(conductor,)] * 4           # 3 failed, the 4th took
            await asyncio.sleep(0.1)
            assert len(d0.attach_conductor.calls) == 4 and sup.membership().by_name["d0"].incarnation == 1
        finally:
            sup.stop()
    asyncio.run(run())
