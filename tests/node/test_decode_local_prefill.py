"""A DecodeNode on the local path (NodeRequest.local_prefill, the Conductor's split-or-local choice):
it prefills the prompt itself, at most `max_prefill_tokens_per_step` prompt tokens per step, beside
split requests whose KV a PrefillNode sends it. Both nodes in this process, fake transfer backend,
no Ray. Outputs equal one engine's; a next turn finds the last one in the decode node's own cache;
an abort and a refused prompt end with one clear answer; after every test both nodes hold nothing."""
from __future__ import annotations

import asyncio
import time

import pytest

from raypd.decode_node.decode_node import DecodeNode
from raypd.prefill_node.prefill_node import PrefillNode
from raypd.protocol.messages import NodeRequest
from tests.node.pd import (
    ENDLESS,
    ENGINE,
    GREEDY,
    PATIENT,
    WAIT_S,
    TokenSink,
    assert_idle,
    prompt,
    request,
    stop_nodes,
    stream_tokens,
)

BUDGET = 8   # prompt tokens per decode-node step: a 40-token prompt takes five steps


@pytest.fixture(scope="module")
def nodes():
    prefill = PrefillNode("lp-prefill", engine_options={"num_blocks": 24}, transfer_options=PATIENT, aux_slots=4)
    decode = DecodeNode("lp-decode", engine_options={"num_blocks": 40, "max_prefill_tokens_per_step": BUDGET},
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


def local(sink: TokenSink, ids, params=GREEDY) -> NodeRequest:
    r = request(ids, params, "", sink.address)
    return NodeRequest(r.request_id, r.room, r.prompt_token_ids, r.params, reply_address=r.reply_address,
                       local_prefill=True)


def test_local_and_split_requests_share_the_decode_node_and_equal_one_engine(nodes, sink, make_llm):
    prefill, decode = nodes
    prompts = [prompt(40, 300), prompt(9, 7000), prompt(33, 20000), prompt(17, 9000)]
    split = [request(ids, GREEDY, prefill.duty.sender.bootstrap_address, sink.address) for ids in prompts[:2]]
    loc = [local(sink, ids) for ids in prompts[2:]]

    async def main():
        before = (await decode.stats())["local_prefills"]
        ends = await asyncio.gather(*(prefill.prefill(r) for r in split),
                                    *(decode.generate(r) for r in [*split, *loc]))
        return ends[2:], (await decode.stats())["local_prefills"] - before
    ends, counted = asyncio.run(main())
    want = [o.token_ids for o in make_llm(**ENGINE).generate([list(p) for p in prompts], GREEDY)]
    assert [stream_tokens(sink, end) for end in ends] == want
    assert counted == 2
    for end in ends[2:]:
        assert end.final.error is None and end.final.finish_reason in ("stop", "length")
        assert "local_prefill_s" in end.final.timings and "kv_wait_s" not in end.final.timings
    for end in ends[:2]:
        assert "kv_wait_s" in end.final.timings and "local_prefill_s" not in end.final.timings


def test_a_next_turn_on_the_local_path_reuses_the_decode_nodes_cache(nodes, sink, make_llm):
    """The first turn went split: its KV landed on the decode node, which keeps it cached after the
    request; the second turn, prefilled there, computes only what is new."""
    prefill, decode = nodes
    first = prompt(48, 4000)
    turn1 = request(first, GREEDY, prefill.duty.sender.bootstrap_address, sink.address)

    async def one_turn():
        _, end = await asyncio.gather(prefill.prefill(turn1), decode.generate(turn1))
        return end
    out1 = stream_tokens(sink, asyncio.run(one_turn()))
    second = (*first, *out1, *prompt(7, 100))
    end2 = asyncio.run(decode.generate(local(sink, second)))
    assert stream_tokens(sink, end2) == make_llm(**ENGINE).generate([list(second)], GREEDY)[0].token_ids
    assert end2.final.num_cached_tokens >= 48


def test_abort_of_a_local_request_ends_it_with_abort(nodes, sink):
    _, decode = nodes
    req = local(sink, prompt(40, 600), ENDLESS)

    async def main():
        end = asyncio.ensure_future(decode.generate(req))
        deadline = time.monotonic() + WAIT_S
        # Until it decodes, so it holds blocks when the abort comes.
        while not ((await decode.stats())["running"] and (await decode.load_report()).queued_prefill_tokens == 0):
            assert time.monotonic() < deadline, "the local request never started decoding"
            await asyncio.sleep(0.005)
        await decode.abort(req.request_id)
        return await end
    end = asyncio.run(main())
    got = stream_tokens(sink, end)
    assert end.final.finish_reason == "abort" and end.final.error is None and len(got) < ENDLESS.max_tokens


def test_a_prompt_the_decode_node_cannot_hold_is_refused_alone(nodes, sink):
    _, decode = nodes
    end = asyncio.run(decode.generate(local(sink, prompt(41 * 16, 300))))
    assert end.final.error and "KV blocks" in end.final.error and end.num_tokens == 0
    stream_tokens(sink, end)
