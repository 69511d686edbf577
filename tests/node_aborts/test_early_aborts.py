"""An abort that reaches a node before its request (Ray does not keep one caller's calls to an actor
in order; a paused or busy node may take the abort first): the request is refused the moment it
arrives, holding nothing, instead of holding a room, a reservation or a stream until its bootstrap
timeout. EarlyAborts' bound and expiry on a fake clock; then real nodes in this process (the tiny
model's engine, the fake transfer backend, no Ray): a prefill node answers no_room with the abort's
reason, a decode and a mixed node end the stream as aborted, and every node is idle after."""
from __future__ import annotations

import asyncio
import time

import pytest

from raypd.decode_node.decode_node import DecodeNode
from raypd.engine import SamplingParams
from raypd.node.early_aborts import EarlyAborts
from raypd.node.mixed_node import MixedNode
from raypd.prefill_node.prefill_node import PrefillNode
from tests.node.pd import GREEDY, PATIENT, assert_idle, prompt, request, stop_nodes, stream_tokens

# Runs for seconds on the node's model (300 tokens, past any end of sequence): surely running when aborted.
LONG = SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_early_abort_is_taken_once_and_forgotten_after_its_time():
    clock = Clock()
    aborts = EarlyAborts(capacity=8, keep_s=10.0, clock=clock)
    aborts.remember("a", "aborted by the client")
    assert aborts.take("b") is None and aborts.num_refused == 0
    assert aborts.take("a") == "aborted by the client" and aborts.num_refused == 1
    assert aborts.take("a") is None                  # one refusal per abort
    aborts.remember("c", "gone")
    clock.now = 10.5
    assert aborts.take("c") is None and len(aborts) == 0


def test_early_aborts_stay_within_their_bound_oldest_dropped_first():
    aborts = EarlyAborts(capacity=3, keep_s=10.0, clock=Clock())
    for rid in "abcd":
        aborts.remember(rid, f"reason {rid}")
    assert len(aborts) == 3 and aborts.take("a") is None and aborts.take("b") == "reason b"
    aborts.remember("c", "again")                    # a repeat moves to the newest end with its reason
    aborts.remember("e", "reason e")
    aborts.remember("f", "reason f")
    assert aborts.take("d") is None and aborts.take("c") == "again"


@pytest.fixture(scope="module")
def nodes():
    prefill = PrefillNode("early-prefill", engine_options={"num_blocks": 24}, transfer_options=PATIENT, aux_slots=4)
    decode = DecodeNode("early-decode", engine_options={"num_blocks": 24}, transfer_options=PATIENT, aux_slots=4)
    mixed = MixedNode("early-mixed", engine_options={"num_blocks": 24})
    try:
        yield prefill, decode, mixed
    finally:
        stop_nodes(prefill, decode, mixed)


def test_a_request_whose_abort_came_first_is_refused_on_arrival_and_holds_nothing(nodes, sink):
    prefill, decode, mixed = nodes
    pd = request(prompt(40, 4000), GREEDY, prefill.duty.sender.bootstrap_address, sink.address)
    local = request(prompt(20, 6000), GREEDY, "", sink.address)

    async def main():
        for node, req in ((prefill, pd), (decode, pd), (mixed, local)):
            await node.abort(req.request_id, "the client went away")
        result = await asyncio.wait_for(prefill.prefill(pd), 10)
        ends = await asyncio.wait_for(asyncio.gather(decode.generate(pd), mixed.generate(local)), 10)
        stats = await asyncio.gather(*(n.stats() for n in nodes))
        return result, ends, stats
    result, (decode_end, mixed_end), stats = asyncio.run(main())
    assert (result.ok, result.error, result.no_room) == (False, "the client went away", True)
    for end in (decode_end, mixed_end):
        assert end.final.finish_reason == "abort" and end.final.error is None and stream_tokens(sink, end) == []
    assert [s["early_aborts"] for s in stats] == [{"remembered": 0, "refused": 1}] * 3
    asyncio.run(assert_idle(prefill, decode))
    assert_mixed_idle(mixed)


def test_an_abort_for_a_request_the_node_holds_is_not_remembered(nodes, sink):
    _, _, mixed = nodes
    done = request(prompt(20, 8000), GREEDY, "", sink.address)
    running = request(prompt(20, 9000), LONG, "", sink.address)

    async def main():
        before = (await mixed.stats())["early_aborts"]
        end = await asyncio.wait_for(mixed.generate(done), 30)   # ended: the node no longer holds it
        task = asyncio.ensure_future(mixed.generate(running))
        deadline = time.monotonic() + 30
        while not (await mixed.stats())["running"]:
            assert time.monotonic() < deadline and not task.done(), "the long request never ran"
            await asyncio.sleep(0.01)
        await mixed.abort(running.request_id)
        return end, await asyncio.wait_for(task, 30), before, (await mixed.stats())["early_aborts"]
    end, aborted, before, after = asyncio.run(main())
    assert end.final.finish_reason in ("stop", "length") and aborted.final.finish_reason == "abort"
    assert after == {"remembered": 0, "refused": before["refused"]}
    assert_mixed_idle(mixed)


def assert_mixed_idle(mixed) -> None:
    """A mixed node has no PD queues (tests.node.pd.assert_idle reads them): nothing held, every block free."""
    idle, load = asyncio.run(mixed.check_idle()), asyncio.run(mixed.load_report())
    assert not any(idle.values()) and load.free_blocks == load.total_blocks, (idle, load)
