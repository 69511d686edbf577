"""Each node's bounded waiting queue, in this process (fake transfer backend, no Ray): while
max_waiting_requests wait there, a decode, prefill or mixed node refuses the next request at once
(finish_reason OVERLOADED / PrefillResult.overloaded) and holds nothing of it; through the real
RequestDriver a refusal on either side ends the request with one OVERLOADED final naming the node
that refused, and the other side is freed at once (no block, room or reservation left of it).

A queue is filled with requests that cannot proceed: on the decode node, a prompt whose blocks do
not fit beside another one's reservation; on the prefill node, a prompt that does not fit beside a
prefilled request whose KV write the fake backend holds back; on the mixed node, a request with no
running slot beside an endless one.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from raypd.cluster.client.node_handles import NodeHandle
from raypd.cluster.client.request_driver import RequestDriver
from raypd.decode_node.decode_node import DecodeNode
from raypd.node.mixed_node import MixedNode
from raypd.prefill_node.prefill_node import PrefillNode
from raypd.protocol.messages import OVERLOADED, HostInfo, TokenChunk
from raypd.protocol.roles import Role
from tests.node.pd import (
    ENDLESS,
    GREEDY,
    PATIENT,
    WAIT_S,
    assert_idle,
    prompt,
    request,
    stop_nodes,
    wait_queue,
)

BIG = 600  # tokens = 38 blocks: two do not fit in 64 (decode), one and a 3-block prompt not in 40 (prefill)


@pytest.fixture(scope="module")
def nodes():
    prefill = PrefillNode("adm-prefill", engine_options={"num_blocks": 40, "max_waiting_requests": 1},
                          transfer_options=PATIENT, aux_slots=4)
    decode = DecodeNode("adm-decode", engine_options={"num_blocks": 64, "max_waiting_requests": 1},
                        transfer_options=PATIENT, aux_slots=4)
    try:
        yield prefill, decode
    finally:
        stop_nodes(prefill, decode)


@pytest.fixture(autouse=True)
def idle_before_and_after(nodes):
    asyncio.run(assert_idle(*nodes))
    yield
    asyncio.run(assert_idle(*nodes))


async def until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


class FullDecodeQueue:
    """`big` reserved on the decode node (its prefill side never comes), `blocked` left waiting for
    memory behind it: the decode node's one waiting place is taken. Leaving aborts both there."""

    def __init__(self, nodes, sink):
        self.prefill, self.decode = nodes
        address = self.prefill.duty.sender.bootstrap_address
        self.reqs = [request(prompt(BIG, start), GREEDY, address, sink.address) for start in (10000, 20000)]
        self.sink = sink
        self.ends: list[asyncio.Future] = []

    async def __aenter__(self):
        for r, stage in zip(self.reqs, ("transfer", "prealloc")):
            self.ends.append(asyncio.ensure_future(self.decode.generate(r)))
            await wait_queue(self.decode, stage, 1)
        await until(lambda: self.decode.duty.prealloc.num_blocked == 1, "a tick to find no memory for the second")
        return self

    async def __aexit__(self, *exc):
        for r in self.reqs:
            await self.decode.abort(r.request_id)
        for r, end in zip(self.reqs, await asyncio.gather(*self.ends)):
            assert end.final.finish_reason == "abort", end
            self.sink.chunks(r.request_id)


class FullPrefillQueue:
    """`big` prefilled with its KV write held back (38 of 40 blocks kept), `waiting` in the prefill
    engine's queue behind it: the prefill node's one waiting place is taken. Leaving lets both end."""

    def __init__(self, nodes, sink):
        self.prefill, self.decode = nodes
        address = self.prefill.duty.sender.bootstrap_address
        self.reqs = [request(prompt(n, start), GREEDY, address, sink.address) for n, start in ((BIG, 30000), (40, 40000))]
        self.sink = sink
        self.calls: list[asyncio.Future] = []

    async def __aenter__(self):
        self.prefill.duty.sender.backend.hold_writes = True  # type: ignore[attr-defined]  # the fake backend's switch
        for r, stage in zip(self.reqs, ("inflight", "queued")):
            self.calls += [asyncio.ensure_future(self.prefill.prefill(r)), asyncio.ensure_future(self.decode.generate(r))]
            await wait_queue(self.prefill, stage, 1)
        await until(lambda: self.prefill.core.engine.num_backlogged() == 1, "a step to leave the second waiting")
        return self

    async def __aexit__(self, *exc):
        self.prefill.duty.sender.backend.hold_writes = False  # type: ignore[attr-defined]
        self.prefill.duty.sender.backend.complete_held()  # type: ignore[attr-defined]
        results = await asyncio.gather(*self.calls)
        assert all(r.ok for r in results[0::2]), results[0::2]
        assert all(e.final.finish_reason in ("stop", "length") for e in results[1::2]), results[1::2]
        for r in self.reqs:
            self.sink.chunks(r.request_id)


def refusal(chunks: list[TokenChunk]) -> TokenChunk:
    """The request's only chunk: an OVERLOADED final with the reason."""
    assert len(chunks) == 1, chunks
    final = chunks[0]
    assert final.finished and final.finish_reason == OVERLOADED and not final.token_ids, final
    assert "is full" in final.error and "max_waiting_requests" in final.error, final
    return final


def test_a_full_decode_node_refuses_at_once_and_holds_nothing(nodes, sink):
    prefill, decode = nodes
    late = request(prompt(20, 3000), GREEDY, prefill.duty.sender.bootstrap_address, sink.address)

    async def main():
        async with FullDecodeQueue(nodes, sink):
            end = await decode.generate(late)
            idle = await decode.check_idle()
        return end, idle, await decode.stats()
    end, idle, stats = asyncio.run(main())
    assert refusal(sink.chunks(late.request_id)) == end.final and end.num_tokens == 0
    assert "adm-decode is full: 1 requests already wait for KV memory" in end.final.error
    assert (idle["rooms"], idle["reservations"]) == (2, 1)  # the two holders', the first one reserved
    assert stats["refused"] == 1


def test_a_full_prefill_node_refuses_at_once_without_opening_a_room(nodes, sink):
    prefill, _ = nodes
    late = request(prompt(20, 4000), GREEDY, prefill.duty.sender.bootstrap_address, sink.address)

    async def main():
        async with FullPrefillQueue(nodes, sink):
            refused = await prefill.prefill(late)
            idle = await prefill.check_idle()
        return refused, idle, await prefill.stats()
    refused, idle, stats = asyncio.run(main())
    assert not refused.ok and refused.overloaded and "adm-prefill is full: 1 requests already wait" in refused.error
    assert idle["rooms"] == 2 and idle["endpoint_rooms"] == 2  # the two holders' only
    assert stats["refused"] == 1


class InProcessActor:
    """A node object as the driver calls an actor: `actor.method.remote(*args)` runs the coroutine
    method as a task of the running loop (what a Ray ObjectRef is to the driver: an awaitable)."""

    def __init__(self, node):
        self._node = node

    def __getattr__(self, name: str):
        method = getattr(self._node, name)
        return type("Method", (), {"remote": staticmethod(lambda *a: asyncio.ensure_future(method(*a)))})


def handles(nodes) -> tuple[NodeHandle, NodeHandle]:
    prefill, decode = nodes
    host = HostInfo("n0", "127.0.0.1", "localhost", 0)
    return (NodeHandle(prefill.name, Role.PREFILL, InProcessActor(prefill), host, 40, prefill.duty.sender.bootstrap_address),
            NodeHandle(decode.name, Role.DECODE, InProcessActor(decode), host, 64))


async def final_of(driver: RequestDriver, rid: str, ids, prefill: NodeHandle, decode: NodeHandle) -> TokenChunk:
    async def run() -> TokenChunk:
        async for chunk in driver.generate(rid, ids, GREEDY, prefill, decode):
            if chunk.finished:
                return chunk
        raise AssertionError("no final chunk")
    return await asyncio.wait_for(run(), WAIT_S)


async def holds(node, expected: dict[str, int]) -> None:
    """Until node.check_idle() shows exactly `expected` for those keys (what is left once an abort landed)."""
    deadline = time.monotonic() + WAIT_S
    while {k: (idle := await node.check_idle())[k] for k in expected} != expected:
        assert time.monotonic() < deadline, idle
        await asyncio.sleep(0.01)


def test_driver_a_prefill_refusal_ends_the_request_and_frees_the_decode_side(nodes, sink):
    _, decode = nodes
    p, d = handles(nodes)

    async def main():
        with RequestDriver(reply_host="127.0.0.1") as driver:
            async with FullPrefillQueue(nodes, sink):
                final = await final_of(driver, "refused-by-prefill", prompt(20, 6000), p, d)
                # The decode side was aborted at once: only the two holders' rooms and blocks are left.
                await holds(decode, {"rooms": 2, "endpoint_rooms": 2, "reservations": 2})
        return final
    final = asyncio.run(main())
    assert final.finish_reason == OVERLOADED and final.failed_node == "adm-prefill", final
    assert "adm-prefill is full" in final.error


def test_driver_a_decode_refusal_ends_the_request_and_frees_the_prefill_side(nodes, sink):
    prefill, _ = nodes
    p, d = handles(nodes)

    async def main():
        with RequestDriver(reply_host="127.0.0.1") as driver:
            async with FullDecodeQueue(nodes, sink):
                final = await final_of(driver, "refused-by-decode", prompt(20, 8000), p, d)
                await holds(prefill, {"rooms": 0, "endpoint_rooms": 0, "requests": 0})  # its room was aborted
        return final
    final = asyncio.run(main())
    assert final.finish_reason == OVERLOADED and final.failed_node == "adm-decode", final
    assert "adm-decode is full" in final.error


def test_a_full_mixed_node_refuses_at_once(sink):
    mixed = MixedNode("adm-mixed", engine_options={"num_blocks": 40, "max_running_requests": 1,
                                                   "max_waiting_requests": 1})
    endless, waiting, late = (request(prompt(12, start), params, reply_address=sink.address)
                              for start, params in ((900, ENDLESS), (1000, GREEDY), (1100, GREEDY)))

    async def main():
        try:
            ends = [asyncio.ensure_future(mixed.generate(r)) for r in (endless, waiting)]
            # One running slot: `waiting` is left waiting by a step while `endless` runs.
            await until(lambda: mixed.core.engine.num_backlogged() == 1, "a step to leave one waiting")
            refused = await mixed.generate(late)
            await mixed.abort(endless.request_id)
            results = await asyncio.gather(*ends)
            idle, stats = await mixed.check_idle(), await mixed.stats()
            return refused, results, idle, stats
        finally:
            await mixed.shutdown()
    refused, (endless_end, waiting_end), idle, stats = asyncio.run(main())
    assert refusal(sink.chunks(late.request_id)) == refused.final and "adm-mixed is full" in refused.final.error
    assert endless_end.final.finish_reason == "abort"
    assert waiting_end.final.finish_reason in ("stop", "length") and waiting_end.num_tokens > 0
    assert not any(idle.values()) and stats["held_blocks"] == 0 and stats["refused"] == 1, (idle, stats)
    for r in (endless, waiting):
        sink.chunks(r.request_id)
