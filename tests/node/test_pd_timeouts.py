"""Every timeout of the PD path, on a PrefillNode and a DecodeNode in this process with short timeouts
(fake transfer backend, no Ray): bootstrap on either node, prealloc on the decode node, transfer.
Each request that times out gets one clear answer on both nodes; the rest goes on; afterwards both
nodes hold nothing."""
from __future__ import annotations

import asyncio
import threading

import pytest

from raypd.decode_node.decode_node import DecodeNode
from raypd.prefill_node.prefill_node import PrefillNode
from raypd.protocol.messages import OVERLOADED
from tests.conftest import keyed
from tests.node.pd import PATIENT, assert_idle, prompt, request, stop_nodes, wait_queue

BOOTSTRAP_S, PREALLOC_S, TRANSFER_S = 2.0, 0.5, 0.5



@pytest.fixture(scope="module")
def nodes():
    prefill = PrefillNode("late-prefill", engine_options={"num_blocks": 24}, aux_slots=4,
                          transfer_options={**PATIENT, "bootstrap_timeout_s": BOOTSTRAP_S,
                                            "transfer_timeout_s": TRANSFER_S})
    decode = DecodeNode("late-decode", engine_options={"num_blocks": 24}, aux_slots=4, prealloc_timeout_s=PREALLOC_S,
                        transfer_options={**PATIENT, "bootstrap_timeout_s": BOOTSTRAP_S})
    try:
        yield prefill, decode
    finally:
        stop_nodes(prefill, decode)


@pytest.fixture(autouse=True)
def idle_before_and_after(nodes):
    asyncio.run(assert_idle(*nodes))
    yield
    nodes[0].duty.sender.backend.hold_writes = False  # type: ignore[attr-defined]  # the fake backend's switch
    asyncio.run(assert_idle(*nodes))


def test_bootstrap_timeout_on_either_node(nodes, sink):
    prefill, decode = nodes
    alone = request(prompt(20, 300))  # no decode node ever sends the destination
    nowhere = request(prompt(20, 300), bootstrap_address=keyed("tcp://127.0.0.1:9"), reply_address=sink.address)

    async def main():
        return await asyncio.gather(prefill.prefill(alone), decode.generate(nowhere), prefill.stats())
    res, end, before = asyncio.run(main())
    assert not res.ok and res.error == "bootstrap timeout: the destination never arrived"
    assert end.final.error == "KV transfer failed: bootstrap timeout: could not register with the sender"
    assert not end.final.token_ids and sink.chunks(nowhere.request_id)[-1] == end.final
    after = asyncio.run(prefill.stats())
    assert after["failed"] == before["failed"] + 1 and after["completed"] == before["completed"]


def test_prealloc_timeout(nodes, sink):
    """`holder` keeps 16 of the decode node's 24 blocks while the prefill node's engine thread is
    held still; `late` needs 10 and gives up after the prealloc timeout. Then `holder` finishes."""
    prefill, decode = nodes
    holder = request(prompt(16 * 16, 1000), bootstrap_address=prefill.duty.sender.bootstrap_address,
                     reply_address=sink.address)
    late = request(prompt(10 * 16, 5000), bootstrap_address=prefill.duty.sender.bootstrap_address,
                   reply_address=sink.address)
    gate = threading.Event()

    async def main():
        # The prefill node's engine thread stops before it takes `holder` (a request computed early
        # would have its write armed, and the sender's thread would deliver it regardless).
        prefill.core.loop.call(gate.wait)
        try:
            prefilled = asyncio.ensure_future(prefill.prefill(holder))
            decoded = asyncio.ensure_future(decode.generate(holder))
            await wait_queue(decode, "transfer", 1)
            late_end = await decode.generate(late)
        finally:
            gate.set()
        return late_end, await prefilled, await decoded
    late_end, res, end = asyncio.run(main())
    assert late_end.final.error == f"no KV memory for the prompt on late-decode within {PREALLOC_S:g}s"
    assert late_end.final.finish_reason == OVERLOADED  # want of capacity, not a fault: the ingress says 429
    assert "prealloc_s" not in late_end.final.timings  # it never got blocks
    assert sink.chunks(late.request_id)[-1] == late_end.final
    assert res.ok and end.final.finish_reason in ("stop", "length") and end.num_tokens > 0
    sink.chunks(holder.request_id)


def test_transfer_timeout(nodes, sink):
    prefill, decode = nodes
    req = request(prompt(40, 9000), bootstrap_address=prefill.duty.sender.bootstrap_address, reply_address=sink.address)

    async def main():
        prefill.duty.sender.backend.hold_writes = True  # type: ignore[attr-defined]  # the write never completes
        return await asyncio.gather(prefill.prefill(req), decode.generate(req))
    res, end = asyncio.run(main())
    assert not res.ok and res.error is not None and res.error.startswith("transfer timeout")
    assert end.final.error is not None and end.final.error.startswith("KV transfer failed")
    assert "transfer timeout" in end.final.error and not end.final.token_ids
    sink.chunks(req.request_id)
