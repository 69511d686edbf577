"""The token stream path without Ray actors or a model: a node's TokenStreams (node/streams.py) sending
to drivers' TokenReceivers (cluster/token_receiver.py) over real pyzmq sockets on loopback, with the
node's generate() return played by a future. Runs in about a second."""
from __future__ import annotations

import asyncio
import time

import pytest
import ray

from raypd.cluster.client.token_receiver import TokenReceiver, TokenStream
from raypd.kvtransfer.data_plane_auth import process_identity
from raypd.kvtransfer.identity import DataPlaneIdentity, PeerKeys
from raypd.node.streams import SEND_HWM, Reply, TokenStreams
from raypd.protocol.messages import StreamEnd, TokenChunk, pack_chunks, unpack_chunks
from tests.conftest import keyed


def chunk(rid, *tokens, finished=False, **kw) -> TokenChunk:
    return TokenChunk(rid, tuple(tokens), finished, "stop" if finished else None, **kw)


async def relay_all(stream, end, tail_s=2.0, chunk_timeout_s=5.0) -> list[TokenChunk]:
    return [c async for c in stream.relay(end, "node-x", chunk_timeout_s, tail_s)]


def test_wire_round_trip_and_strict_decoding():
    chunks = [chunk("a", 1, 2), chunk("b", 3, finished=True, num_cached_tokens=16, timings={"total_s": 0.25}),
              TokenChunk("c", (), True, None, "KV transfer failed: timeout"), chunk("d", 4, early=True)]
    assert unpack_chunks(pack_chunks(chunks)) == chunks
    good = chunks[0].to_wire()
    assert TokenChunk.from_wire(good[:7]) == chunks[0]   # a sender from before `early`
    assert TokenChunk.from_wire(good[:8]).offset == -1    # ... or from before offsets
    assert TokenChunk.from_wire([*good[:8], 12]).offset == 12
    for offset in (-2, 1.0, "3", True):
        with pytest.raises(ValueError):
            TokenChunk.from_wire([*good[:8], offset])
    for wire in ([*good[:7], 1], [*good[:2], True, *good[3:7], True]):   # not a bool; an early final
        with pytest.raises(ValueError):
            TokenChunk.from_wire(wire)
    for bad in (b"\xc1", pack_chunks([])[:-1], b"\x92\x02\x90"):  # not msgpack, truncated, version 2
        with pytest.raises(ValueError):
            unpack_chunks(bad)
    for wire in (good[:6], [1, *good[1:]], [good[0], ["1"], *good[2:]], [good[0], [True], *good[2:]],
                 [*good[:2], 1, *good[3:]], [*good[:6], {"t": "x"}], {"request_id": "a"}):
        with pytest.raises(ValueError):
            TokenChunk.from_wire(wire)


def test_one_message_per_caller_per_flush_and_the_final_chunk_after_every_token():
    async def main():
        a, b = TokenReceiver("127.0.0.1"), TokenReceiver("127.0.0.1")
        node = TokenStreams()
        try:
            ends = {rid: Reply() for rid in ("a1", "a2", "b1")}
            streams = {"a1": a.open("a1"), "a2": a.open("a2"), "b1": b.open("b1")}
            for rid, addr in (("a1", a.address), ("a2", a.address), ("b1", b.address)):
                assert node.open(rid, addr, ends[rid])
            relays = {rid: asyncio.ensure_future(relay_all(streams[rid], ends[rid].wait())) for rid in ends}
            for step in range(3):
                for rid in ends:
                    node.push(chunk(rid, step, finished=(step == 2 and rid != "a2")))
                node.flush()
                await asyncio.sleep(0.01)
            node.push(chunk("a2", 3, finished=True))
            node.flush()
            got = {rid: await asyncio.wait_for(r, 5) for rid, r in relays.items()}
            assert node.num_messages == 3 * 2 + 1 and node.num_dropped == 0 and not node.open_ids()
            for rid, chunks in got.items():
                assert [c.finished for c in chunks][-1] and sum(c.finished for c in chunks) == 1
                assert [t for c in chunks for t in c.token_ids] == ([0, 1, 2, 3] if rid == "a2" else [0, 1, 2])
            assert a.num_messages == 4 and b.num_messages == 3
        finally:
            node.close()
            a.close()
            b.close()
    asyncio.run(main())


def test_end_before_tokens_lost_tokens_dead_node_and_silence():
    async def main():
        rx = TokenReceiver("127.0.0.1")
        node = TokenStreams()
        try:
            loop = asyncio.get_running_loop()
            # The Ray return overtakes the tokens: the final chunk still comes after all of them.
            stream = rx.open("r1")
            assert node.open("r1", rx.address, Reply())
            final = chunk("r1", 7, finished=True)
            end = loop.create_future()
            end.set_result(StreamEnd(final, 3))
            relay = asyncio.ensure_future(relay_all(stream, end))
            await asyncio.sleep(0.05)
            node.push(chunk("r1", 5, 6))
            node.push(final)
            node.flush()
            chunks = await asyncio.wait_for(relay, 5)
            assert [c.token_ids for c in chunks] == [(5, 6), (7,)] and chunks[-1] == final
            # A message that never arrives: the node counted 3 tokens, 1 came.
            stream = rx.open("r2")
            end = loop.create_future()
            end.set_result(StreamEnd(chunk("r2", 9, finished=True), 3))
            node.open("r2", rx.address, Reply())
            node.push(chunk("r2", 1))
            node.flush()
            chunks = await relay_all(stream, end, tail_s=0.2)
            assert chunks[0].token_ids == (1,) and "lost 2 of 3 tokens" in chunks[-1].error
            # The node dies: its call fails at once, whatever the stream says.
            stream = rx.open("r3")
            end = loop.create_future()
            end.set_exception(ray.exceptions.RayActorError())
            chunks = await relay_all(stream, end)
            assert len(chunks) == 1 and "node-x failed: RayActorError" in chunks[0].error
            # Silence: neither tokens nor an end.
            chunks = await relay_all(rx.open("r4"), loop.create_future(), chunk_timeout_s=0.1)
            assert chunks[-1].finished and "no token from node node-x" in chunks[-1].error
            with pytest.raises(ValueError):
                rx.open("r4")  # still open: the driver closes it
        finally:
            node.close()
            rx.close()
    asyncio.run(main())


def test_the_prefill_nodes_early_first_token_is_yielded_once_whichever_copy_comes_first():
    """A PD request's first token comes twice: early from the prefill node (another socket, so in any
    order with the decode node's tokens) and in the decode node's stream. The caller sees each token
    once, in order, and the stream still ends once every token the decode node counted arrived."""
    async def main():
        rx = TokenReceiver("127.0.0.1")
        prefill, decode = TokenStreams(), TokenStreams()
        loop = asyncio.get_running_loop()

        async def run(rid, order, final_tokens=(9,), num_tokens=3, early=(7,)):
            stream = rx.open(rid)
            assert decode.open(rid, rx.address, Reply())
            end = loop.create_future()
            end.set_result(StreamEnd(chunk(rid, *final_tokens, finished=True), num_tokens))
            relay = asyncio.ensure_future(relay_all(stream, end))
            for who in order:   # each delivered and taken by the relay before the next is sent
                before = rx.num_messages
                if who == "early":
                    prefill.post(rx.address, chunk(rid, *early, early=True))
                    prefill.flush()
                else:
                    decode.push(chunk(rid, *who) if who != "final" else chunk(rid, *final_tokens, finished=True))
                    decode.flush()
                deadline = time.monotonic() + 10
                while rx.num_messages == before or stream.queued:
                    assert time.monotonic() < deadline, f"{rid}: {who} was not delivered"
                    await asyncio.sleep(0.001)
                await asyncio.sleep(0)  # the relay handles what it took before it waits again
            chunks = await asyncio.wait_for(relay, 5)
            stream.close()
            return chunks
        try:
            # The usual order: the early copy first; the decode node's copy of token 7 is dropped.
            got = await run("e1", ["early", (7,), (8,), "final"])
            assert [c.token_ids for c in got] == [(7,), (8,), (9,)] and got[-1].finished and not got[-1].error
            assert got[0].early      # the copy the caller got is the prefill node's
            # The decode node's tokens first: the early copy is dropped.
            got = await run("e2", [(7, 8), "early", "final"])
            assert [c.token_ids for c in got] == [(7, 8), (9,)] and not any(c.early for c in got)
            # The early copy, then the decode node's first token together with the rest, in its final chunk.
            got = await run("e3", ["early", "final"], final_tokens=(7, 8), num_tokens=2)
            assert [c.token_ids for c in got] == [(7,), (8,)] and got[-1].finished and not got[-1].error
            # An early copy of more than the first token is not a prefill node's: dropped.
            got = await run("e4", ["early", (7, 8), "final"], early=(5, 6))
            assert [t for c in got for t in c.token_ids] == [7, 8, 9]
            # An early copy for a request no longer open here is dropped without harm.
            prefill.post(rx.address, chunk("gone", 1, early=True))
            prefill.flush()
            assert prefill.num_messages == 5 and prefill.open_ids() == []
        finally:
            prefill.close()
            decode.close()
            rx.close()
    asyncio.run(main())


def test_open_refusals_and_a_caller_that_never_reads():
    async def main():
        node = TokenStreams()
        try:
            first, dup, bad = Reply(), Reply(), Reply()
            assert node.open("r", keyed("tcp://127.0.0.1:1"), first)  # nobody listens there
            assert not node.open("r", keyed("tcp://127.0.0.1:1"), dup)
            assert "already streaming" in (await dup.wait(1)).final.error
            assert not node.open("s", "no-such-transport://x", bad)
            end = await bad.wait(1)
            assert end.final.finished and "cannot stream tokens" in end.final.error and end.num_tokens == 0
            t0 = time.monotonic()
            for step in range(SEND_HWM + 50):  # the engine thread never waits for a caller
                node.push(chunk("r", step))
                node.flush()
            assert time.monotonic() - t0 < 2.0 and node.num_dropped >= 50
            node.push(chunk("r", 0, finished=True))
            node.flush()
            end = await first.wait(1)
            assert end.num_tokens == SEND_HWM + 51 and not node.open_ids()
        finally:
            node.close()
    asyncio.run(main())


def test_a_node_the_caller_learns_is_hung_ends_its_streams_at_once():
    async def main():
        rx = TokenReceiver("127.0.0.1")
        node = TokenStreams()
        try:
            loop = asyncio.get_running_loop()
            hung, other = rx.open("h1"), rx.open("o1")
            assert node.open("h1", rx.address, Reply())
            node.push(chunk("h1", 4, 5))
            node.flush()
            # The node's call never returns and no more tokens come (a frozen process).
            relays = [asyncio.ensure_future(_collect(s.relay(loop.create_future(), name, 60.0, 1.0)))
                      for s, name in ((hung, "node-x"), (other, "node-y"))]
            await asyncio.sleep(0.1)
            assert rx.fail_node("node-x", "node node-x is unresponsive") == 1
            chunks = await asyncio.wait_for(relays[0], 5)      # long before the 60 s chunk timeout
            assert chunks[0].token_ids == (4, 5)
            assert chunks[-1].finished and chunks[-1].error == "node node-x is unresponsive"
            assert hung.stream_failed and not relays[1].done()  # another node's stream is untouched
            relays[1].cancel()
        finally:
            node.close()
            rx.close()
    asyncio.run(main())


async def _collect(agen) -> list:
    return [c async for c in agen]


def test_a_lost_message_is_a_gap_the_caller_sees_never_a_hole():
    """A real full queue: the node streams to a caller address before the caller listens there, so
    its queue fills (SEND_HWM messages) and the next 50 steps are dropped. Once the caller listens,
    the queued steps arrive, then a later one: the stream yields exactly the contiguous tokens and
    ends with an error naming the lost ones, from which the caller replays (without offsets it would
    have gone on after the hole)."""
    from raypd.benchmarks.serve.ports import free_port

    async def main():
        port = free_port()
        node = TokenStreams()
        rx = None
        # The caller's keys exist before it listens (the address it will have is known).
        rx_identity = DataPlaneIdentity.generate("driver", PeerKeys(process_identity().peers.as_dict()))
        try:
            assert node.open("g", rx_identity.address(f"tcp://127.0.0.1:{port}"), Reply())
            for step in range(SEND_HWM + 50):
                node.push(chunk("g", step))
                node.flush()
            assert node.num_dropped == 50
            rx = TokenReceiver("127.0.0.1", rx_identity, port=port)
            stream = rx.open("g")
            relay = asyncio.ensure_future(relay_all(stream, asyncio.get_running_loop().create_future(),
                                                    chunk_timeout_s=30))
            deadline = time.monotonic() + 30
            while stream.received < SEND_HWM:  # the queued steps drain to the caller
                assert time.monotonic() < deadline, stream.received
                await asyncio.sleep(0.05)
            node.push(chunk("g", SEND_HWM + 50))  # a step after the lost ones
            node.flush()
            chunks = await asyncio.wait_for(relay, 30)
            assert [t for c in chunks for t in c.token_ids] == list(range(SEND_HWM))
            assert chunks[-1].finished and stream.stream_failed
            assert f"lost tokens {SEND_HWM}-{SEND_HWM + 49}" in chunks[-1].error
        finally:
            node.close()
            if rx is not None:
                rx.close()
    asyncio.run(main())


def test_a_repeated_chunk_yields_only_what_is_new():
    async def main():
        loop = asyncio.get_running_loop()
        stream = TokenStream("d", {})
        for c in (chunk("d", 1, 2, offset=0), chunk("d", 2, 3, offset=1), chunk("d", 1, 2, 3, offset=0),
                  chunk("d", 4, offset=3)):
            stream.deliver(c)
        end = loop.create_future()
        end.set_result(StreamEnd(chunk("d", 5, finished=True, offset=4), 5))
        loop.call_later(0.05, stream.deliver, chunk("d", 5, finished=True, offset=4))
        chunks = await relay_all(stream, end)
        assert [t for c in chunks for t in c.token_ids] == [1, 2, 3, 4, 5] and not chunks[-1].error
    asyncio.run(main())
