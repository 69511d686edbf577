"""A node whose transfer endpoint is broken (made while its host had no network, and its backend then
refused a peer: kvtransfer/bootstrap/endpoint_health.py) fails as a crashed engine does, in this
process, no Ray, over the fake backend whose `unreachable` switch plays a UCX worker made while the
host's link was down: every pending call gets NodeCrashedError, ready() fails, the Conductor is told
the node is dead (inside Ray the actor would then restart with a new backend), the peers' requests
end with the refusal and every block on every node is accounted for. Its healthy peers stay healthy."""
from __future__ import annotations

import asyncio

import pytest
import torch

from raypd.decode_node.decode_node import DecodeNode
from raypd.kvtransfer import KVSender
from raypd.node.conductor_link import ConductorLink
from raypd.node.engine_loop import NodeCrashedError
from raypd.prefill_node.prefill_node import PrefillNode
from tests.kvtransfer.offline import made_offline
from tests.node.pd import GREEDY, PATIENT, WAIT_S, RecordingConductor, assert_idle, config, prompt, request

REFUSED = ("KV transfer failed: sender lost: registration refused: backend refused the peer: TransferError: "
           "fake backend:")


async def crashed(node, conductor: RecordingConductor) -> BaseException:
    """The error that ended the node's engine thread, once the crash path has told the Conductor."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not conductor.dead:
        assert asyncio.get_running_loop().time() < deadline, "the node never reported itself dead"
        await asyncio.sleep(0.01)
    assert node.core.loop.crashed is not None
    return node.core.loop.crashed


def watched(node) -> RecordingConductor:
    """A Conductor double the node's link reports to, as attach_conductor() would set it up in Ray."""
    conductor = RecordingConductor()
    node.core._conductor_link = link = ConductorLink(node, conductor, None)
    link.start()
    return conductor


def pools_like(node):
    """A pool and aux buffer of the node's layout, for a bare KVSender standing in for a prefill node."""
    pool = node.core.engine.kv_cache.pool
    return torch.zeros_like(pool), torch.zeros_like(node.duty.aux.buffer)


def test_a_prefill_node_whose_sender_is_broken_fails_like_a_crashed_engine(sink):
    async def run():
        with made_offline():
            prefill = PrefillNode("broken-prefill", engine_options={"num_blocks": 16}, transfer_options=PATIENT)
        decodes = [DecodeNode(f"healthy-decode-{i}", engine_options={"num_blocks": 16}, transfer_options=PATIENT)
                   for i in range(2)]
        try:
            prefill.duty.sender.backend.unreachable = True  # type: ignore[attr-defined]  # the fake's switch
            conductor = watched(prefill)
            reqs = [request(prompt(20, 1000 + 100 * i), GREEDY, prefill.duty.sender.bootstrap_address, sink.address)
                    for i in range(2)]
            prefills = [asyncio.ensure_future(prefill.prefill(r)) for r in reqs]
            # Each decode node registers with the prefill node's sender for its request and is refused.
            ends = await asyncio.gather(*(d.generate(r) for d, r in zip(decodes, reqs)))
            error = await crashed(prefill, conductor)
            assert type(error).__name__ == "EndpointBrokenError"
            assert str(error).startswith("transfer endpoint broken-prefill is broken: it was made while its host "
                                         "had no network")
            for call in prefills:
                with pytest.raises(NodeCrashedError, match="EndpointBrokenError"):
                    await asyncio.wait_for(call, WAIT_S)
            with pytest.raises(NodeCrashedError):
                await prefill.ready()
            assert conductor.dead == [("broken-prefill", f"engine crashed: {error!r}")]
            for end in ends:   # what each decode node's caller saw
                assert end.final.finished and (end.final.error or "").startswith(REFUSED), end.final
                assert sink.chunks(end.final.request_id)[-1] == end.final
            prefill.core.engine.check_block_integrity()   # its thread has ended: the engine is ours to read
            await assert_idle(*decodes)
            for d in decodes:   # made with the network up: healthy, serving
                assert d.duty.receiver.broken is None and (await d.ready())["name"] == d.name
        finally:
            for node in (prefill, *decodes):
                await node.shutdown()
    asyncio.run(run())


def test_a_decode_node_whose_receiver_is_broken_fails_like_a_crashed_engine(sink):
    async def run():
        with made_offline():
            decode = DecodeNode("broken-decode", engine_options={"num_blocks": 16}, transfer_options=PATIENT)
        sender = KVSender(*pools_like(decode), config(), name="healthy-prefill")
        try:
            decode.duty.receiver.backend.unreachable = True  # type: ignore[attr-defined]  # before it registers
            conductor = watched(decode)
            req = request(prompt(20, 2000), GREEDY, sender.bootstrap_address, sink.address)
            end = await decode.generate(req)
            error = await crashed(decode, conductor)
            # Refused, and the node's engine thread ends meanwhile: the refusal or the crash ends it.
            assert (end.final.error or "").startswith((REFUSED, f"node broken-decode crashed: {error!r}")), end.final
            assert str(error).startswith("transfer endpoint broken-decode is broken: it was made while its host "
                                         "had no network")
            assert "healthy-prefill refused it" in str(error)
            with pytest.raises(NodeCrashedError):
                await decode.ready()
            assert conductor.dead == [("broken-decode", f"engine crashed: {error!r}")]
            decode.core.engine.check_block_integrity()
            assert sender.broken is None and sender.stats().rooms == 0
        finally:
            await decode.shutdown()
            sender.close()
    asyncio.run(run())
