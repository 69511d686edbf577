"""FlexNode: a prefill half and a decode half on one engine, whose duty the planner sets. Two flex
nodes in this process, fake transfer backend, no Ray: each prefills for the other while it decodes
the other's prompts, outputs equal one engine's; a duty change waits for the old duty's work to end
(the request routed before it is served, not refused) and can be called off; after every test both
nodes hold nothing."""
from __future__ import annotations

import asyncio

import pytest

from raypd.flex_node.flex_node import FlexNode
from raypd.protocol.duty import Duty
from raypd.protocol.messages import NodeRequest
from tests.node.pd import GREEDY, PATIENT, WAIT_S, assert_idle, prompt, request, stop_nodes, stream_tokens, wait_held

ENGINE = {"num_blocks": 48, "chunked_prefill_size": 16, "max_num_batched_tokens": 16}


@pytest.fixture(scope="module")
def nodes():
    a = FlexNode("flex-a", engine_options=ENGINE, transfer_options=PATIENT, aux_slots=4, duty=Duty.PREFILL)
    b = FlexNode("flex-b", engine_options=ENGINE, transfer_options=PATIENT, aux_slots=4, duty=Duty.DECODE)
    try:
        yield a, b
    finally:
        stop_nodes(a, b)


@pytest.fixture(autouse=True)
def idle_before_and_after(nodes):
    asyncio.run(assert_idle(*nodes))
    yield
    asyncio.run(assert_idle(*nodes))
    for node, duty in zip(nodes, (Duty.PREFILL, Duty.DECODE)):  # each test starts from the fixture's duties
        assert asyncio.run(node.set_duty(duty)) == duty.value


def test_each_node_prefills_for_the_other_while_decoding_its_prompts(nodes, sink, make_llm):
    a, b = nodes
    prompts = [prompt(40, 300), prompt(9, 7000), prompt(33, 20000), prompt(17, 9000), prompt(25, 15000)]
    a_to_b = [request(ids, GREEDY, a.duty.prefill.sender.bootstrap_address, sink.address) for ids in prompts[:2]]
    b_to_a = [request(ids, GREEDY, b.duty.prefill.sender.bootstrap_address, sink.address) for ids in prompts[2:4]]
    r = request(prompts[4], GREEDY, "", sink.address)
    on_a_alone = NodeRequest(r.request_id, r.room, r.prompt_token_ids, r.params, reply_address=r.reply_address,
                             local_prefill=True)

    async def main():
        results = await asyncio.gather(*(a.prefill(x) for x in a_to_b), *(b.prefill(x) for x in b_to_a),
                                       *(b.generate(x) for x in a_to_b), *(a.generate(x) for x in b_to_a),
                                       a.generate(on_a_alone))
        return results[:4], results[4:], await a.stats(), await b.stats()
    prefills, ends, a_stats, b_stats = asyncio.run(main())
    assert all(p.ok for p in prefills), prefills
    want = [o.token_ids for o in make_llm(**ENGINE).generate([list(p) for p in prompts], GREEDY)]
    assert [stream_tokens(sink, end) for end in ends] == want
    for stats in (a_stats, b_stats):
        assert stats["prefill"]["completed"] >= 2 and stats["completed"] == stats["prefill"]["completed"]
    assert a_stats["local_prefills"] >= 1


def test_a_duty_change_drains_the_old_duty_first(nodes, sink, make_llm):
    """a is a prefill node holding a prompt whose decode side has not come yet: set_duty(decode) cannot
    settle until that prefill ends, and a reports the drain meanwhile (the Conductor routes it nothing)."""
    a, b = nodes
    req = request(prompt(30, 4000), GREEDY, a.duty.prefill.sender.bootstrap_address, sink.address)

    async def main():
        before = (await a.stats())["duty_changes"]
        prefill = asyncio.ensure_future(a.prefill(req))
        await wait_held(a, 1, ("inflight",))   # computed at once, its write armed until the decode side comes
        assert await a.set_duty("decode") == Duty.TO_DECODE.value
        report = await a.load_report()
        assert report.duty == Duty.TO_DECODE.value and report.waiting + report.inflight == 1
        assert (await a.stats())["duty"] == Duty.TO_DECODE.value
        end = await asyncio.wait_for(b.generate(req), WAIT_S)   # the decode side arrives: the prefill ends
        result = await asyncio.wait_for(prefill, WAIT_S)
        for _ in range(int(WAIT_S / 0.01)):     # settled on the engine thread's next tick
            if (await a.load_report()).duty == Duty.DECODE.value:
                break
            await asyncio.sleep(0.01)
        return result, end, (await a.stats())["duty_changes"] - before
    result, end, changes = asyncio.run(main())
    assert result.ok
    assert stream_tokens(sink, end) == make_llm(**ENGINE).generate([list(req.prompt_token_ids)], GREEDY)[0].token_ids
    assert asyncio.run(a.load_report()).duty == Duty.DECODE.value
    assert changes == 1


def test_an_idle_node_changes_duty_at_once_and_a_drain_can_be_called_off(nodes, sink):
    a, b = nodes
    assert asyncio.run(b.set_duty("prefill", 1234.5)) == Duty.PREFILL.value    # held nothing: settled at once
    report = asyncio.run(b.load_report())   # echoes the order's stamp, so the Conductor believes it
    assert (report.duty, report.duty_order) == (Duty.PREFILL.value, 1234.5)
    req = request(prompt(20, 600), GREEDY, b.duty.prefill.sender.bootstrap_address, sink.address)

    async def main():
        prefill = asyncio.ensure_future(b.prefill(req))
        await wait_held(b, 1)
        draining = await b.set_duty("decode")
        called_off = await b.set_duty("prefill")     # back to the duty it was leaving: nothing to drain
        await asyncio.wait_for(a.generate(req), WAIT_S)
        await asyncio.wait_for(prefill, WAIT_S)
        return draining, called_off
    draining, called_off = asyncio.run(main())
    assert (draining, called_off) == (Duty.TO_DECODE.value, Duty.PREFILL.value)
    with pytest.raises(ValueError, match="unknown duty"):
        asyncio.run(a.set_duty("both"))


def test_duty_lifecycle():
    assert Duty.PREFILL.toward(Duty.DECODE) is Duty.TO_DECODE
    assert Duty.TO_DECODE.toward(Duty.DECODE) is Duty.TO_DECODE
    assert Duty.TO_DECODE.toward(Duty.PREFILL) is Duty.PREFILL
    assert Duty.DECODE.toward(Duty.DECODE) is Duty.DECODE
    assert Duty.DECODE.toward(Duty.TO_PREFILL) is Duty.TO_PREFILL
    assert [d.role for d in Duty] == ["prefill", None, "decode", None]
