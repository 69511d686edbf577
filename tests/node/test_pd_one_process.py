"""A PrefillNode and a DecodeNode in this process, with their engine threads running, talking over the
fake transfer backend (real ZMQ bootstrap sockets on 127.0.0.1), no Ray: requests through both nodes
equal one engine's output, and an abort in every stage of either node, from either side, ends the
request on both with one clear answer. After every test both nodes hold nothing (check_idle() all
zeros, every block free or evictable, block accounting exact)."""
from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import replace

import pytest
import torch

from raypd.decode_node.decode_node import DecodeNode
from raypd.prefill_node.prefill_node import PrefillNode
from raypd.protocol.messages import NodeRequest, PrefillResult
from raypd.protocol.roles import Role
from tests.node.pd import (
    ENDLESS,
    ENGINE,
    GREEDY,
    PATIENT,
    WAIT_S,
    assert_idle,
    prompt,
    request,
    stop_nodes,
    stream_tokens,
    wait_held,
    wait_queue,
)

PREFILL_BLOCKS, DECODE_BLOCKS = 24, 40


@pytest.fixture(scope="module")
def nodes():
    prefill = PrefillNode("one-prefill", engine_options={"num_blocks": PREFILL_BLOCKS}, transfer_options=PATIENT,
                          aux_slots=4)
    decode = DecodeNode("one-decode", engine_options={"num_blocks": DECODE_BLOCKS}, transfer_options=PATIENT,
                        aux_slots=4)
    try:
        yield prefill, decode
    finally:
        stop_nodes(prefill, decode)


@pytest.fixture(autouse=True)
def idle_before_and_after(nodes):
    asyncio.run(assert_idle(*nodes))
    yield
    prefill, _ = nodes
    prefill.duty.sender.backend.hold_writes = False  # type: ignore[attr-defined]  # the fake backend's switch
    asyncio.run(assert_idle(*nodes))


def pd_request(nodes, sink, ids, params=GREEDY) -> NodeRequest:
    return request(ids, params, nodes[0].duty.sender.bootstrap_address, sink.address)


def test_requests_go_through_both_nodes_and_equal_one_engine(nodes, sink, make_llm):
    prefill, decode = nodes
    prompts = [prompt(5, 300), prompt(12, 7000), prompt(16, 20000)]  # one prefill chunk each, here and there
    reqs = [pd_request(nodes, sink, ids) for ids in prompts]

    async def main():
        info = await asyncio.gather(prefill.ready(), decode.ready())
        results = await asyncio.gather(*(prefill.prefill(r) for r in reqs), *(decode.generate(r) for r in reqs))
        return info, results[:3], results[3:], await prefill.stats(), await prefill.drain_kv_events()
    (p_info, d_info), prefilled, ends, p_stats, events = asyncio.run(main())
    # Built and run without Ray: the host is this process, metrics record nothing.
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
    assert p_info["host"].pid == d_info["host"].pid == os.getpid() and p_info["host"].node_id == ""

    assert p_info["role"] == Role.PREFILL and d_info["role"] == Role.DECODE and "bootstrap_address" in p_info
    assert (p_info["num_blocks"], d_info["num_blocks"], p_info["block_size"]) == (PREFILL_BLOCKS, DECODE_BLOCKS, 16)
    want = [o.token_ids for o in make_llm(**ENGINE).generate([list(p) for p in prompts], GREEDY)]
    assert [stream_tokens(sink, end) for end in ends] == want
    for res, end in zip(prefilled, ends):
        assert isinstance(res, PrefillResult) and res.ok and res.error is None
        assert {"bootstrap_s", "queue_s", "prefill_s", "transfer_s", "total_s", "kv_write_s",
                "kv_ack_s"} <= set(res.timings) <= {"bootstrap_s", "queue_s", "prefill_s", "transfer_s", "total_s",
                                                    "kv_write_s", "kv_ack_s", "armed_s"}   # armed_s: when the prefill won
        assert end.final.finish_reason in ("stop", "length") and end.final.error is None
        assert set(end.final.timings) >= {"prealloc_s", "kv_wait_s", "total_s"}
    assert p_stats["completed"] >= 3 and p_stats["queues"] == {"bootstrap": 0, "queued": 0, "inflight": 0,
                                                                "aborting": 0}
    assert [e.block_hashes for e in events.events]  # the 16-token prompt's block went into the radix cache


def test_abort_in_bootstrap(sink):
    """With early admission off (SGLang's order), a request without a destination waits in
    BootstrapStage, holding nothing but its room."""
    prefill = PrefillNode("sglang-order", engine_options={"num_blocks": PREFILL_BLOCKS}, transfer_options=PATIENT,
                          aux_slots=4, max_early_prefills=0)
    req = request(prompt(20, 300), GREEDY, prefill.duty.sender.bootstrap_address, sink.address)

    async def main():
        try:
            result = asyncio.ensure_future(prefill.prefill(req))  # no decode node ever sends a destination
            await wait_queue(prefill, "bootstrap", 1)
            load = await prefill.load_report()
            await prefill.abort(req.request_id)
            res = await result
            await assert_idle(prefill)
            return load, res
        finally:
            await prefill.shutdown()
    load, res = asyncio.run(main())
    assert load.waiting == 1 and load.queued_prefill_tokens == 20 and load.role == Role.PREFILL
    assert not res.ok and res.error == "aborted by the client" and "bootstrap_s" not in res.timings


def test_a_request_computes_before_its_destination_and_an_abort_frees_its_armed_write(nodes, sink):
    """Early admission: the prompt is computed while no decode side has come, its write armed; an
    abort then ends it at once (no byte was moving), the prompt's KV left in the prefix cache."""
    prefill, decode = nodes
    req = pd_request(nodes, sink, prompt(20, 300))

    async def main():
        result = asyncio.ensure_future(prefill.prefill(req))  # no decode node ever sends a destination
        await wait_queue(prefill, "inflight", 1)
        load = await prefill.load_report()
        await prefill.abort(req.request_id)
        return load, await result
    load, res = asyncio.run(main())
    assert load.inflight == 1 and load.waiting == 0 and load.queued_prefill_tokens == 0
    assert not res.ok and res.error == "aborted by the client"
    assert {"bootstrap_s", "queue_s", "prefill_s"} <= set(res.timings) and "kv_write_s" not in res.timings


def test_a_late_destination_gets_the_armed_write_and_the_output_equals_one_engine(nodes, sink, make_llm):
    """The decode side comes only after the prompt was computed: the armed write is posted as its
    destination arrives, and the stream equals one engine's."""
    prefill, decode = nodes
    req = pd_request(nodes, sink, prompt(40, 800))

    async def main():
        result = asyncio.ensure_future(prefill.prefill(req))
        await wait_queue(prefill, "inflight", 1)   # prefilled, armed
        end = await asyncio.wait_for(decode.generate(req), WAIT_S)
        return await asyncio.wait_for(result, WAIT_S), end
    res, end = asyncio.run(main())
    assert res.ok and res.timings["armed_s"] > 0
    assert res.timings["bootstrap_s"] < res.timings["armed_s"]   # computed first, then waited for the decode side
    want = make_llm(**ENGINE).generate([list(req.prompt_token_ids)], GREEDY)[0].token_ids
    assert stream_tokens(sink, end) == want


def test_the_prefill_node_streams_the_first_token_before_the_decode_side_comes(nodes, sink, make_llm):
    """early_first_token: the first token reaches the caller while no decode side exists yet (the
    prompt computed early, its write armed); the decode node's stream then carries it again, which the
    caller's TokenStream drops. A first token that ends the request (its length, or a stop token)
    comes only in the decode node's final chunk: no early copy, so no stop token reaches the text."""
    prefill, decode = nodes
    ids = prompt(40, 900)
    want = make_llm(**ENGINE).generate([list(ids)], GREEDY)[0].token_ids

    def run(params, early_chunks):
        req = replace(pd_request(nodes, sink, ids, params), early_first_token=True)

        async def main():
            result = asyncio.ensure_future(prefill.prefill(req))
            await wait_queue(prefill, "inflight", 1)   # prefilled, armed: no decode side has come
            early = sink.take(req.request_id, early_chunks)
            end = await asyncio.wait_for(decode.generate(req), WAIT_S)
            return early, await asyncio.wait_for(result, WAIT_S), end
        early, res, end = asyncio.run(main())
        assert res.ok
        chunks = early + sink.chunks(req.request_id)
        assert chunks[-1] == end.final and not any(c.early for c in chunks[len(early):])
        return early, [t for c in chunks[len(early):] for t in c.token_ids]

    early, decoded = run(GREEDY, 1)
    assert [(c.early, c.finished, c.token_ids) for c in early] == [(True, False, (want[0],))]
    assert decoded == want   # the decode node's stream is whole: the caller's end drops the copy
    for ends_at_once in (replace(GREEDY, max_tokens=1), replace(GREEDY, stop_token_ids=(want[0],))):
        early, decoded = run(ends_at_once, 0)
        assert early == [] and decoded == want[:1]


@pytest.mark.parametrize("who", ["prefill", "decode"])
def test_abort_while_the_prefill_waits_in_the_engine(nodes, sink, who):
    """`holder`'s KV is in flight (the write held), keeping 12 of the prefill node's 24 blocks; `waiter`
    needs 14, so the engine keeps it waiting: the abort comes while it is surely there."""
    prefill, decode = nodes
    holder = pd_request(nodes, sink, prompt(12 * 16, 1000))
    waiter = pd_request(nodes, sink, prompt(14 * 16, 5000))

    async def main():
        prefill.duty.sender.backend.hold_writes = True  # type: ignore[attr-defined]
        held = [asyncio.ensure_future(c) for c in (prefill.prefill(holder), decode.generate(holder))]
        await wait_queue(prefill, "inflight", 1)
        await wait_held_write(prefill)
        waiting = [asyncio.ensure_future(c) for c in (prefill.prefill(waiter), decode.generate(waiter))]
        await wait_queue(prefill, "queued", 1)
        stats, load = await prefill.stats(), await prefill.load_report()
        assert stats["waiting"] == 1 and load.waiting == 1 and load.inflight == 1
        assert load.queued_prefill_tokens == 14 * 16  # none of it computed
        await (prefill.abort(waiter.request_id) if who == "prefill" else decode.abort(waiter.request_id))
        aborted = await asyncio.gather(*waiting)
        prefill.duty.sender.backend.hold_writes = False  # type: ignore[attr-defined]
        assert prefill.duty.sender.backend.complete_held() == 1  # type: ignore[attr-defined]
        return aborted, await asyncio.gather(*held)
    (res, end), (held_res, held_end) = asyncio.run(main())
    assert not res.ok and not end.final.token_ids
    if who == "prefill":
        assert res.error == "aborted by the client"
        assert end.final.error == "KV transfer failed: aborted by the sender: aborted by the client"
    else:
        assert res.error == "aborted by the receiver: aborted by the client"
        assert end.final.finish_reason == "abort" and end.final.error is None
    stream_tokens(sink, end)
    assert held_res.ok and held_end.final.finish_reason in ("stop", "length") and stream_tokens(sink, held_end)


@pytest.mark.parametrize("revocable", [True, False], ids=["refusable-writes", "one-sided-writes"])
@pytest.mark.parametrize("who", ["prefill", "decode"])
def test_abort_while_the_kv_is_in_flight(nodes, sink, who, revocable):
    """The write is held. The prefill node's source blocks stay held until it stops, whoever aborts.
    The decode node's destination blocks stay held too when it cannot refuse the write (nixl's
    one-sided writes); when it can (tcp, the fake), they are freed at once and the write is refused."""
    prefill, decode = nodes
    decode.duty.receiver.backend.revocable = revocable
    req = pd_request(nodes, sink, prompt(40, 9000))

    async def main():
        prefill.duty.sender.backend.hold_writes = True  # type: ignore[attr-defined]
        prefill.duty.sender.backend.unrecallable_writes = True  # type: ignore[attr-defined]
        both = [asyncio.ensure_future(c) for c in (prefill.prefill(req), decode.generate(req))]
        await wait_queue(prefill, "inflight", 1)
        await wait_queue(decode, "transfer", 1)
        await wait_held_write(prefill)   # posted: on a busy machine the sender's loop may lag the queues
        before = decode.core.engine.kv_cache.pool.clone()
        refused = decode.duty.receiver.backend.num_refused  # type: ignore[attr-defined]
        if who == "prefill":  # the client went away: like the driver, abort on both sides
            await prefill.abort(req.request_id)
        await decode.abort(req.request_id)
        if revocable:
            await wait_until_async(lambda: decode.stats(), lambda st: st["reservations"] == 0)
        else:
            await wait_queue(decode, "aborting", 1)
        if who == "prefill":
            await wait_queue(prefill, "aborting", 1)
        # Nothing freed under the write: the engine request holding the source blocks, and (one-sided
        # writes) the reservation.
        assert (await prefill.check_idle())["requests"] == 1
        assert (await decode.stats())["reservations"] == (0 if revocable else 1)
        prefill.duty.sender.backend.hold_writes = False  # type: ignore[attr-defined]
        assert prefill.duty.sender.backend.complete_held() == 1  # type: ignore[attr-defined]
        if revocable:  # the late write was refused: the freed blocks kept their bytes
            assert decode.duty.receiver.backend.num_refused == refused + 1  # type: ignore[attr-defined]
            assert torch.equal(decode.core.engine.kv_cache.pool, before)
        return await asyncio.gather(*both)
    res, end = asyncio.run(main())
    assert not res.ok and res.error == ("aborted by the client" if who == "prefill"
                                        else "aborted by the receiver: aborted by the client")
    assert end.final.finish_reason == "abort" and not stream_tokens(sink, end)


async def wait_held_write(prefill) -> None:
    """Until the prefill node's write is posted and held by the fake backend."""
    backend = prefill.duty.sender.backend

    async def held() -> int:
        return backend.num_held
    await wait_until_async(held, lambda n: n == 1)


async def wait_until_async(read, ok, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while not ok(value := await read()):
        if time.monotonic() > deadline:
            raise AssertionError(f"never reached: {value}")
        await asyncio.sleep(0.005)


def test_abort_in_prealloc_and_in_transfer(nodes, sink):
    """`holder`'s destination waits at the prefill node, which never got the request, holding 12 of the
    decode node's 40 blocks; `big` needs 30 of the 28 left and waits in PREALLOC."""
    prefill, decode = nodes
    holder = pd_request(nodes, sink, prompt(12 * 16, 1000))
    big = pd_request(nodes, sink, prompt(30 * 16, 5000))

    async def main():
        held = asyncio.ensure_future(decode.generate(holder))
        await wait_queue(decode, "transfer", 1)
        waiting = asyncio.ensure_future(decode.generate(big))
        await wait_queue(decode, "prealloc", 1)
        load = await decode.load_report()
        assert (load.waiting, load.inflight, load.role) == (2, 1, Role.DECODE)
        await decode.abort(big.request_id)
        big_end = await waiting
        assert (await decode.stats())["queues"]["transfer"] == 1
        await decode.abort(holder.request_id)
        return big_end, await held
    big_end, held_end = asyncio.run(main())
    for end in (big_end, held_end):
        assert end.final.finish_reason == "abort" and end.final.error is None and not stream_tokens(sink, end)
    assert "kv_wait_s" not in big_end.final.timings and "prealloc_s" in held_end.final.timings


@pytest.mark.parametrize("how", ["abort", "cancel"])
def test_abort_while_running(nodes, sink, how):
    prefill, decode = nodes
    req = pd_request(nodes, sink, prompt(20, 400), ENDLESS)

    async def main():
        result = asyncio.ensure_future(prefill.prefill(req))
        decoding = asyncio.ensure_future(decode.generate(req))
        await wait_queue(decode, "running", 1)
        if how == "abort":
            await decode.abort(req.request_id)
            return await result, await decoding
        decoding.cancel()  # the caller's call went away: the node aborts the request itself
        with pytest.raises(asyncio.CancelledError):
            await decoding
        await wait_queue(decode, "running", 0)
        return await result, None
    res, end = asyncio.run(main())
    assert res.ok  # the prefill side was done: its KV had arrived
    if end is not None:
        got = stream_tokens(sink, end)
        assert end.final.finish_reason == "abort" and 0 < len(got) < ENDLESS.max_tokens
    else:
        final = sink.chunks(req.request_id)[-1]
        assert final.finish_reason == "abort"


def test_requests_either_node_refuses(nodes, sink):
    prefill, decode = nodes
    ok = pd_request(nodes, sink, prompt(8, 300))
    no_address = request(prompt(8, 300), GREEDY, "", sink.address)
    too_long = pd_request(nodes, sink, prompt(DECODE_BLOCKS * 16, 300))

    async def main():
        first = asyncio.ensure_future(prefill.prefill(ok))
        await wait_held(prefill, 1)
        again = await prefill.prefill(ok)
        await prefill.abort(ok.request_id)
        return (await first, again, await prefill.prefill(too_long),
                await decode.generate(no_address), await decode.generate(too_long))
    first, again, p_long, d_no_address, d_long = asyncio.run(main())
    assert not first.ok and not again.ok and "already on this node" in (again.error or "")
    assert not p_long.ok and "KV blocks" in (p_long.error or "")
    assert "bootstrap address" in (d_no_address.final.error or "")
    assert "KV blocks" in (d_long.final.error or "")
    for end in (d_no_address, d_long):
        stream_tokens(sink, end)
