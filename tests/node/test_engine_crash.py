"""An engine-thread crash, caused for real (EngineLoop.inject_crash makes the thread raise at its next
turn), on a prefill node and on a decode node in this process with the fake transfer backend, no
Ray: every pending call returns an error at once (no hang), every open stream ends with an error
chunk, ready() fails from then on, and the Conductor link reports the node failed and stops, so the
node never re-registers as idle. Each test builds its own nodes: a crashed node serves no more."""
from __future__ import annotations

import asyncio

import pytest

from raypd.decode_node.decode_node import DecodeNode
from raypd.node.engine_loop import NodeCrashedError
from raypd.prefill_node.prefill_node import PrefillNode
from tests.conftest import keyed
from tests.node.pd import ENDLESS, PATIENT, WAIT_S, RecordingConductor, TokenSink, prompt, request, wait_held


async def crash(node) -> None:
    node.core.crash_engine("test crash")
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while node.core.loop.crashed is None:
        assert asyncio.get_running_loop().time() < deadline, "the engine thread did not crash"
        await asyncio.sleep(0.01)


def test_prefill_node_crash_fails_pending_calls_at_once():
    async def run():
        prefill = PrefillNode("crash-prefill", engine_options={"num_blocks": 16}, transfer_options=PATIENT)
        link_conductor = RecordingConductor()
        try:
            # No decode side ever registers: the request waits (computed, its write armed) until the crash.
            pending = asyncio.ensure_future(prefill.prefill(request(prompt(40), ENDLESS)))
            # A prefix import from a source that never writes: it waits for the write until the crash.
            copy = asyncio.ensure_future(prefill.import_prefix(list(prompt(32)), 77, keyed("tcp://127.0.0.1:9")))
            await wait_held(prefill, 1)
            from raypd.node.conductor_link import ConductorLink
            prefill.core._conductor_link = link = ConductorLink(prefill, link_conductor, None)
            link.start()
            await crash(prefill)
            for call in (pending, copy):
                with pytest.raises(NodeCrashedError):
                    await asyncio.wait_for(call, WAIT_S)
            with pytest.raises(NodeCrashedError):
                await prefill.ready()
            with pytest.raises(NodeCrashedError):
                await prefill.prefill(request(prompt(8)))   # a call after the crash: refused at once
            with pytest.raises(NodeCrashedError):
                await prefill.load_report()
            assert link_conductor.dead and link_conductor.dead[0][0] == "crash-prefill"
            assert "test crash" in link_conductor.dead[0][1]
            await asyncio.sleep(0.05)
            assert link.stopped   # never registers again
        finally:
            await prefill.shutdown()
    asyncio.run(run())


def test_decode_node_crash_ends_every_stream_with_an_error():
    sink = TokenSink()

    async def run():
        decode = DecodeNode("crash-decode", engine_options={"num_blocks": 16}, transfer_options=PATIENT)
        try:
            # Waits in TRANSFER for a prefill node that never writes (an unreachable bootstrap address
            # fails the room; a silent one keeps it waiting): a listening socket nobody answers on.
            reqs = [request(prompt(20, 1000 + 50 * i), ENDLESS, keyed("tcp://127.0.0.1:9"), sink.address) for i in range(2)]
            calls = [asyncio.ensure_future(decode.generate(r)) for r in reqs]
            await asyncio.sleep(0.2)
            await crash(decode)
            for r, call in zip(reqs, calls):
                end = await asyncio.wait_for(call, WAIT_S)
                assert end.final.finished and "crashed" in (end.final.error or "")
                assert sink.chunks(r.request_id)[-1].error == end.final.error
            with pytest.raises(NodeCrashedError):
                await decode.ready()
        finally:
            await decode.shutdown()
    try:
        asyncio.run(run())
    finally:
        sink.close()


def test_the_chaos_hooks_refuse_unless_the_node_was_built_with_them():
    """crash_engine(), fail_requests() and hold_steps() are Ray-callable on every node; in production
    (no chaos hooks) they refuse, and the node goes on serving."""
    from raypd.node.mixed_node import MixedNode
    from raypd.node.node_actor import ChaosHooksDisabled

    async def run():
        node = MixedNode("hooks-off", engine_options={"num_blocks": 16})
        try:
            with pytest.raises(ChaosHooksDisabled, match="--chaos-hooks"):
                await node.crash_engine()
            with pytest.raises(ChaosHooksDisabled):
                await node.fail_requests(5)
            with pytest.raises(ChaosHooksDisabled):
                await node.hold_steps(60)
            await asyncio.sleep(0.1)
            assert node.core.loop.crashed is None and (await node.ready())["name"] == "hooks-off"
        finally:
            await node.shutdown()
        armed = MixedNode("hooks-on", engine_options={"num_blocks": 16}, chaos_hooks=True)
        try:
            assert await armed.fail_requests(0) == 0
            await armed.crash_engine()
            deadline = asyncio.get_running_loop().time() + WAIT_S
            while armed.core.loop.crashed is None:   # the engine thread goes down for real
                assert asyncio.get_running_loop().time() < deadline, "crash_engine() did not crash it"
                await asyncio.sleep(0.01)
        finally:
            await armed.shutdown()
    asyncio.run(run())
