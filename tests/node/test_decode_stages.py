"""The decode node's stages one by one, driven by hand on this thread: a real engine (its steps run
here), a KVReceiver on its pool and a bare KVSender standing in for the prefill node, over the fake
backend. Every transition, every abort from either side, every timeout, and what each one frees."""
from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
import torch

from raypd.decode_node.decode_request import DecodePhase, DecodeRequest
from raypd.decode_node.prealloc_stage import PreallocStage
from raypd.decode_node.running_stage import RunningStage
from raypd.decode_node.transfer_stage import TransferStage
from raypd.engine.engine import LLMEngine
from raypd.engine.errors import InvalidRequestError
from raypd.kvtransfer import KVReceiver, KVSender
from raypd.kvtransfer import TransferState as S
from raypd.node.aux_slots import AUX_MAGIC, AUX_WIDTH, AuxRecord, AuxSlots
from raypd.protocol.messages import TokenChunk
from raypd.protocol.sampling_params import SamplingParams
from tests.conftest import keyed
from tests.node.pd import ENGINE, config, prompt, request, wait_until

THREE = SamplingParams(max_tokens=3, temperature=0.0)



class Streams:
    """Stands in for TokenStreams: keeps what the running stage pushes."""

    def __init__(self) -> None:
        self.pushed: list[TokenChunk] = []

    def push(self, chunk: TokenChunk) -> None:
        self.pushed.append(chunk)


@dataclass
class Side:
    engine: LLMEngine
    aux: AuxSlots
    receiver: KVReceiver
    peer: KVSender  # plays the prefill node
    peer_aux: torch.Tensor  # its aux buffer: the tests write the record the prefill node would
    prealloc: PreallocStage
    transfer: TransferStage
    running: RunningStage
    streams: Streams

    def new(self, n: int = 40, params: SamplingParams = THREE) -> DecodeRequest:
        return DecodeRequest(request(prompt(n), params, self.peer.bootstrap_address), t={"arrived": time.time()})

    def to_transfer(self, dr: DecodeRequest) -> None:
        self.prealloc.add(dr)
        assert self.prealloc.pop_ready() == [dr]
        self.transfer.add(dr)

    def send(self, dr: DecodeRequest, first_token: int = 7, cached: int = 16, n: int | None = None,
             room: int | None = None) -> list[int]:
        """The prefill stand-in writes the prompt's KV and aux record; its source blocks."""
        src = list(range(len(dr.blocks)))
        self.peer_aux[1] = torch.tensor([first_token, cached, n or len(dr.req.prompt_token_ids),
                                         dr.room if room is None else room, AUX_MAGIC])
        self.peer.send(dr.room, src, 1)
        return src


def make_peer(engine: LLMEngine, **cfg) -> tuple[KVSender, torch.Tensor]:
    """A prefill stand-in: 8 blocks of random KV and two aux slots."""
    aux = torch.zeros(2, AUX_WIDTH, dtype=torch.int64)
    return KVSender(torch.randn_like(engine.kv_cache.pool[:8]), aux, config(**cfg)), aux


def make_side(engine: LLMEngine, timeout_s: float = 60.0, **cfg) -> Side:
    aux = AuxSlots(2)
    receiver = KVReceiver(engine.kv_cache.pool, aux.buffer, config(**cfg))
    streams = Streams()
    return Side(engine, aux, receiver, *make_peer(engine), PreallocStage(engine, aux, timeout_s),
                TransferStage(engine, receiver, aux), RunningStage(engine, streams), streams)  # type: ignore[arg-type]


@pytest.fixture
def engine(make_llm) -> LLMEngine:
    eng = make_llm(**ENGINE).engine
    eng.prefix_cache.reset()  # every test starts with all 16 blocks free
    assert eng.allocator.num_free == 16
    return eng


def close(side: Side) -> None:
    side.receiver.close()
    side.peer.close()


@pytest.fixture
def side(engine):
    s = make_side(engine)
    yield s
    close(s)
    assert s.aux.num_free == 2 and not s.prealloc and not s.transfer and not s.running


def assert_freed(side: Side) -> None:
    """Nothing held: no engine request or reservation, no room, every aux slot back."""
    eng = side.engine
    eng.check_block_integrity()
    assert not eng.requests and not eng.reservations and side.receiver.stats().rooms == 0 and side.aux.num_free == 2
    assert eng.allocator.num_free + eng.prefix_cache.num_evictable_blocks == 16


def release_peer(side: Side, dr: DecodeRequest) -> None:
    wait_until(lambda: side.peer.poll(dr.room).is_terminal, "the peer's room")
    side.peer.release(dr.room)


def test_a_request_walks_through_the_three_stages(side):
    dr = side.new(40)
    side.peer.add_room(dr.room)
    side.prealloc.add(dr)
    assert dr.phase == DecodePhase.PREALLOC and len(side.prealloc) == 1
    assert side.prealloc.pop_ready() == [dr] and not side.prealloc
    assert len(dr.blocks) == 3 and side.engine.reservations[dr.request_id] == dr.blocks and dr.aux_slot == 0
    assert side.engine.allocator.num_free == 13

    side.transfer.add(dr)
    assert dr.phase == DecodePhase.TRANSFER and side.transfer.pop_ready() == []
    wait_until(lambda: side.peer.poll(dr.room) == S.WAITING_FOR_INPUT, "the destination")
    assert side.peer.destination(dr.room)[0].tolist() == dr.blocks  # type: ignore[index]
    src = side.send(dr, first_token=7, cached=16)
    wait_until(lambda: side.receiver.poll(dr.room) == S.SUCCESS, "the KV")
    assert side.transfer.pop_ended() == []
    assert side.transfer.pop_ready() == [dr] and dr.record == AuxRecord(7, 16, 40, dr.room)
    assert torch.equal(side.engine.kv_cache.pool[dr.blocks], side.peer.backend.pool[src])
    blocks = dr.blocks
    assert dr.aux_slot is None and side.aux.num_free == 2 and side.receiver.stats().rooms == 0
    assert side.engine.reservations[dr.request_id] == blocks  # still reserved, for the engine to take

    side.running.add(dr)
    assert dr.phase == DecodePhase.RUNNING and dr.num_cached_tokens == 16
    assert not side.engine.reservations and side.engine.requests[dr.request_id].block_table[:3] == blocks
    assert side.streams.pushed == [TokenChunk(dr.request_id, (7,), num_cached_tokens=16)]  # the first token
    finished = []
    for _ in range(5):
        finished += side.running.pop_ready(side.engine.step())
    assert [(d, out.finish_reason) for d, out in finished] == [(dr, "length")]  # max_tokens=3
    assert len(side.streams.pushed) == 2 and "first_step" in dr.t
    release_peer(side, dr)
    assert_freed(side)


def test_prealloc_is_first_come_first_served_with_back_pressure(side):
    big, bigger, small = side.new(160), side.new(128), side.new(16)  # 10, 8 and 1 blocks of 16
    for dr in (big, bigger, small):
        side.prealloc.add(dr)
    assert side.prealloc.pop_ready() == [big] and side.engine.allocator.num_free == 6
    assert side.prealloc.pop_ready() == [] and len(side.prealloc) == 2  # `small` fits, but waits its turn
    side.engine.unreserve(big.request_id)
    side.aux.give_back(big.aux_slot)
    assert side.prealloc.pop_ready() == [bigger, small] and side.engine.allocator.num_free == 7
    side.prealloc.add(big)
    assert side.prealloc.pop_ready() == []  # no aux slot left, though 7 blocks are free
    side.prealloc.abort(big)
    assert big.aborting and not side.prealloc and side.engine.allocator.num_free == 7
    for dr in (bigger, small):
        side.engine.unreserve(dr.request_id)
        side.aux.give_back(dr.aux_slot)
    assert_freed(side)


def test_prealloc_timeout(engine):
    side = make_side(engine, timeout_s=0.3)
    try:
        assert engine.reserve("blocker", 16 * 16) is not None  # every block
        dr = side.new(16)
        side.prealloc.add(dr)
        assert side.prealloc.pop_ready() == [] and side.prealloc.pop_ended() == []
        wait_until(lambda: side.prealloc.pop_ended() == [dr], "the prealloc timeout")
        assert not dr.blocks and dr.aux_slot is None and not side.prealloc
        engine.unreserve("blocker")
        assert_freed(side)
    finally:
        close(side)


def test_the_prefill_node_aborts_during_transfer(side):
    dr = side.new(40)
    side.peer.add_room(dr.room)
    side.to_transfer(dr)
    wait_until(lambda: side.peer.poll(dr.room) == S.WAITING_FOR_INPUT, "the destination")
    side.peer.abort(dr.room, "prefill failed")
    wait_until(lambda: side.transfer.pop_ended() == [dr], "the room to fail")
    assert dr.error == "KV transfer failed: aborted by the sender: prefill failed" and not dr.aborting
    assert not dr.blocks and dr.aux_slot is None
    release_peer(side, dr)
    assert_freed(side)


def test_abort_during_transfer_before_the_prefill_started(side):
    dr = side.new(40)
    side.to_transfer(dr)  # the prefill node never opens the room: the destination waits as an orphan
    wait_until(lambda: side.receiver.poll(dr.room) == S.WAITING_FOR_INPUT, "the destination")
    side.transfer.abort(dr)
    assert side.transfer.num_aborting == 1
    wait_until(lambda: side.transfer.pop_ended() == [dr], "the sender's confirmation")
    assert dr.aborting and dr.error is None
    assert_freed(side)


def test_abort_during_a_held_write_keeps_the_blocks_until_it_stops_when_writes_cannot_be_refused(side):
    side.receiver.backend.revocable = False  # as nixl: a posted write lands whatever the receiver does
    dr = side.new(40)
    side.peer.add_room(dr.room)
    side.to_transfer(dr)
    wait_until(lambda: side.peer.poll(dr.room) == S.WAITING_FOR_INPUT, "the destination")
    side.peer.backend.hold_writes = True
    side.send(dr)
    wait_until(lambda: side.receiver.poll(dr.room) == S.TRANSFERRING, "the write to start")
    side.transfer.abort(dr)
    wait_until(lambda: side.peer.rooms.require(dr.room).aborting, "the abort to reach the sender")
    # The write may still land: the blocks stay reserved.
    assert side.transfer.pop_ended() == [] and side.engine.reservations[dr.request_id] == dr.blocks
    side.peer.backend.hold_writes = False
    assert side.peer.backend.complete_held() == 1
    wait_until(lambda: side.transfer.pop_ended() == [dr], "the room to end")
    assert dr.aborting and dr.error is None
    release_peer(side, dr)
    assert_freed(side)


def test_abort_during_a_held_write_frees_the_blocks_at_once_and_the_late_write_is_refused(side):
    dr = side.new(40)
    side.peer.add_room(dr.room)
    side.to_transfer(dr)
    wait_until(lambda: side.peer.poll(dr.room) == S.WAITING_FOR_INPUT, "the destination")
    side.peer.backend.hold_writes = side.peer.backend.unrecallable_writes = True
    side.send(dr)
    wait_until(lambda: side.receiver.poll(dr.room) == S.TRANSFERRING, "the write to start")
    blocks = list(dr.blocks)
    before = side.receiver.backend.pool[blocks].clone()
    side.transfer.abort(dr)
    # The window closed with the abort: nothing of the room can land, so it ends without the sender.
    wait_until(lambda: side.transfer.pop_ended() == [dr], "the room to end")
    assert dr.aborting and dr.error is None
    side.peer.backend.hold_writes = False
    assert side.peer.backend.complete_held() == 1  # the late write arrives ...
    assert side.receiver.backend.num_refused == 1  # ... and is refused
    assert torch.equal(side.receiver.backend.pool[blocks], before)
    wait_until(lambda: side.peer.poll(dr.room) == S.FAILED, "the sender to give the room up")
    release_peer(side, dr)
    assert_freed(side)


@pytest.mark.parametrize("stale", [{"n": 41}, {"room": 12345}], ids=["prompt-length", "room"])
def test_a_stale_aux_record_fails_the_request(side, stale):
    """A record for another prompt length, or for another room with the same length (a late write
    into a reused slot), is not this request's: it fails instead of decoding from it."""
    dr = side.new(40)
    side.peer.add_room(dr.room)
    side.to_transfer(dr)
    wait_until(lambda: side.peer.poll(dr.room) == S.WAITING_FOR_INPUT, "the destination")
    side.send(dr, **stale)
    wait_until(lambda: side.receiver.poll(dr.room) == S.SUCCESS, "the KV")
    assert side.transfer.pop_ready() == [dr]
    with pytest.raises(InvalidRequestError, match="without a valid aux record"):
        side.running.add(dr)
    assert not side.running and side.streams.pushed == []
    release_peer(side, dr)
    assert_freed(side)


def test_abort_while_running(side):
    dr = side.new(40, SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True))
    side.peer.add_room(dr.room)
    side.to_transfer(dr)
    wait_until(lambda: side.peer.poll(dr.room) == S.WAITING_FOR_INPUT, "the destination")
    side.send(dr)
    wait_until(lambda: side.receiver.poll(dr.room) == S.SUCCESS, "the KV")
    side.running.add(*side.transfer.pop_ready())
    assert side.running.pop_ready(side.engine.step()) == [] and len(side.streams.pushed) == 2
    side.running.abort(dr)
    assert dr.aborting and not side.running and not side.engine.has_unfinished()
    assert side.running.pop_ready(side.engine.step()) == []
    release_peer(side, dr)
    assert_freed(side)


@pytest.mark.parametrize("what", ["bootstrap", "transfer"])
def test_timeouts_on_the_receiver(engine, what):
    side = make_side(engine, **{f"{what}_timeout_s": 0.3})
    try:
        if what == "bootstrap":  # nobody listens at the prefill node's address
            dr = DecodeRequest(request(prompt(40), bootstrap_address=keyed("tcp://127.0.0.1:9")), t={"arrived": time.time()})
            side.to_transfer(dr)
        else:  # the write never completes; the sender gives up as soon
            side.peer.close()
            side.peer, side.peer_aux = make_peer(engine, transfer_timeout_s=0.3)
            dr = side.new(40)
            side.peer.add_room(dr.room)
            side.to_transfer(dr)
            wait_until(lambda: side.peer.poll(dr.room) == S.WAITING_FOR_INPUT, "the destination")
            side.peer.backend.hold_writes = True
            side.send(dr)
        wait_until(lambda: side.transfer.pop_ended() == [dr], f"the {what} timeout")
        assert dr.error is not None and dr.error.startswith("KV transfer failed") and f"{what} timeout" in dr.error
        if what == "transfer":
            release_peer(side, dr)
        assert_freed(side)
    finally:
        close(side)
