"""The request's priority on its way to a route, without Ray: the ingress passes the request's
`priority` to its router on the first attempt and on a retry; the ConductorRouter passes it to the
Conductor and to its local fallback; the LocalRouter weighs only the queued tokens a request at
that priority waits behind."""
from __future__ import annotations

import asyncio
import json

import pytest
import ray.exceptions

from raypd.cluster.client.conductor_router import ConductorRouter
from raypd.cluster.client.local_router import LocalRouter
from raypd.cluster.client.membership import Member, Membership, MemberState
from raypd.cluster.client.node_set import NodeSet
from raypd.cluster.client.router import Route, Router
from raypd.protocol.messages import LoadReport, TokenChunk
from raypd.protocol.roles import Role
from raypd.protocol.sampling_params import DEFAULT_PRIORITY
from tests.serve.test_failover import DECODE_DIED, AttemptDriver
from tests.serve.test_ingress_app import MIXED_NODE, MODEL, app_for, call
from tests.serve.test_membership import FakeNode, handle, membership


class PriorityRecorder(Router):
    """Routes everything to one mixed node; records (call, priority)."""

    def __init__(self):
        self.calls: list[tuple[str, int]] = []

    async def route(self, request_id, prompt_token_ids, exclude=frozenset(), priority=DEFAULT_PRIORITY):
        self.calls.append(("route", priority))
        return Route(MIXED_NODE)

    async def reroute(self, request_id, prompt_token_ids, exclude=frozenset(), priority=DEFAULT_PRIORITY):
        self.calls.append(("reroute", priority))
        return Route(MIXED_NODE)


@pytest.mark.parametrize("fields, priority", [({"priority": -2}, -2), ({}, DEFAULT_PRIORITY)], ids=["set", "unset"])
def test_the_ingress_routes_each_attempt_with_the_request_priority(tokenizer, fields, priority):
    ok = [TokenChunk("", (), finished=True, finish_reason="length")]
    driver, router = AttemptDriver([[DECODE_DIED], ok]), PriorityRecorder()
    body = json.dumps({"model": MODEL, "prompt": "Hello", "max_tokens": 8, **fields}).encode()
    status, _ = asyncio.run(call(app_for(tokenizer, driver, router), body))
    assert status == 200
    assert router.calls == [("route", priority), ("reroute", priority)]   # the retry keeps it
    assert [params.priority for _, _, params in driver.attempts] == [priority] * 2


def test_the_conductor_router_passes_the_priority_to_the_conductor_and_its_fallback():
    async def run():
        m, conductor = membership()
        conductor.decision = ("p0", "d0")
        fallback = PriorityRecorder()
        router = ConductorRouter(conductor, NodeSet(m), fallback=fallback)
        await router.route("r", [1])
        await router.route("r", [1], priority=-2)
        await router.reroute("r", [1], priority=3)
        assert [c[4] for c in conductor.route.calls] == [DEFAULT_PRIORITY, -2, 3]
        conductor.error = ray.exceptions.ActorDiedError()
        await router.route("r", [1], priority=7)
        assert fallback.calls == [("route", 7)]
    asyncio.run(run())


def _report(name: str, role: Role, waiting: int, queued: int, levels: tuple[tuple[int, int], ...]) -> LoadReport:
    return LoadReport(node_name=name, role=role, queued_prefill_tokens=queued, waiting=waiting, running=0,
                      free_blocks=64, total_blocks=64, cached_blocks=0, timestamp=1.0,
                      queued_prefill_by_priority=levels)


def test_the_local_router_weighs_the_queued_tokens_the_request_waits_behind():
    """p0 holds a batch flood (156 requests' worth of tokens at priority 5), p1 a short queue at
    the default priority: an urgent request goes to p0, whose flood it passes; a batch one to p1."""
    fakes = [FakeNode("p0", Role.PREFILL), FakeNode("p1", Role.PREFILL), FakeNode("d0", Role.DECODE)]
    loads = [_report("p0", Role.PREFILL, 4, 40_000, ((5, 40_000),)),
             _report("p1", Role.PREFILL, 2, 2048, ((DEFAULT_PRIORITY, 2048),)),
             _report("d0", Role.DECODE, 0, 0, ())]
    m = Membership(1, tuple(Member(handle(f), MemberState.LIVE, load=r) for f, r in zip(fakes, loads)),
                   None, MemberState.NONE)

    async def run():
        router = LocalRouter(NodeSet(m))
        assert (await router.route("urgent", [1], priority=DEFAULT_PRIORITY)).prefill.name == "p0"
        assert (await router.route("batch", [1], priority=5)).prefill.name == "p1"
    asyncio.run(run())
