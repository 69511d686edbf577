"""The prefill node's stages one by one, driven by hand on this thread: a real engine (its steps run
here), a KVSender on its pool and a bare KVReceiver standing in for the decode node, over the fake
backend. Every transition, every abort from either side, every timeout, and what each one frees."""
from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
import torch

from raypd.engine.engine import LLMEngine
from raypd.kvtransfer import KVReceiver, KVSender
from raypd.kvtransfer import TransferState as S
from raypd.node.aux_slots import AUX_MAGIC, AUX_WIDTH, AuxSlots
from raypd.prefill_node.bootstrap_stage import BootstrapStage
from raypd.prefill_node.inflight_stage import InflightStage
from raypd.prefill_node.prefill_request import PrefillPhase, PrefillRequest
from raypd.prefill_node.waiting_stage import WaitingStage
from tests.node.pd import ENGINE, config, prompt, request, wait_until


@dataclass
class Side:
    engine: LLMEngine
    aux: AuxSlots
    sender: KVSender
    peer: KVReceiver  # plays the decode node
    bootstrap: BootstrapStage
    waiting: WaitingStage
    inflight: InflightStage

    def new(self, n: int = 40) -> PrefillRequest:
        # reply: the node answers the caller, never a stage
        return PrefillRequest(request(prompt(n)), reply=None, t={"arrived": time.time()})  # type: ignore[arg-type]

    def destination(self, pr: PrefillRequest, blocks: list[int], aux_slot: int = 1) -> None:
        """The decode node reserved `blocks` and sends them."""
        self.peer.add_room(pr.room, self.sender.bootstrap_address, blocks, aux_slot)
        wait_until(lambda: self.sender.poll(pr.room) >= S.WAITING_FOR_INPUT, "the destination")

    def prefill(self, pr: PrefillRequest) -> None:
        """Step the engine until the request is prefilled; it moves on to InflightStage."""
        for _ in range(10):
            ready = self.waiting.pop_ready(self.engine.step())
            if ready:
                assert ready == [pr] and pr.first_token >= 0
                self.inflight.add(pr)
                return
        raise AssertionError("not prefilled in 10 steps")


def make_side(engine: LLMEngine, **cfg) -> Side:
    aux = AuxSlots(2)
    sender = KVSender(engine.kv_cache.pool, aux.buffer, config(**cfg))
    peer = KVReceiver(torch.zeros_like(engine.kv_cache.pool[:8]), torch.zeros(2, AUX_WIDTH, dtype=torch.int64),
                      config())
    return Side(engine, aux, sender, peer, BootstrapStage(sender, aux), WaitingStage(engine, sender, aux),
                InflightStage(engine, sender, aux))


@pytest.fixture
def engine(make_llm) -> LLMEngine:
    eng = make_llm(**ENGINE).engine
    eng.prefix_cache.reset()  # every test starts with all 16 blocks free
    assert eng.allocator.num_free == 16
    return eng


@pytest.fixture
def side(engine):
    s = make_side(engine)
    yield s
    s.peer.close()
    s.sender.close()
    assert s.aux.num_free == 2 and not s.bootstrap and not s.waiting and not s.inflight


def release_peer(side: Side, *prs: PrefillRequest) -> None:
    """Wait for the decode stand-in's rooms to end (failed, or landed before an abort), release them."""
    for pr in prs:
        wait_until(lambda: side.peer.poll(pr.room).is_terminal, "the peer's room")  # noqa: B023
        side.peer.release(pr.room)


def assert_freed(side: Side, cached_blocks: int = 0) -> None:
    """Nothing held: no engine request, no room, every aux slot back, blocks free or cached."""
    eng = side.engine
    eng.check_block_integrity()
    assert not eng.requests and side.sender.stats().rooms == 0 and side.aux.num_free == 2
    assert eng.prefix_cache.num_cached_blocks == cached_blocks
    assert eng.allocator.num_free == 16 - cached_blocks


def test_a_request_walks_through_the_three_stages(side):
    pr = side.new(40)  # 3 blocks: two full, one partial
    side.bootstrap.add(pr)
    assert pr.phase == PrefillPhase.BOOTSTRAP and len(side.bootstrap) == 1
    assert side.sender.poll(pr.room) == S.BOOTSTRAPPING and side.bootstrap.pop_ready() == []
    assert side.bootstrap.num_prompt_tokens == 40 and side.engine.allocator.num_free == 16  # no blocks yet
    side.destination(pr, [5, 6, 7], aux_slot=1)
    assert side.bootstrap.pop_ready() == [pr] and pr.aux_slot == 0 and not side.bootstrap

    side.waiting.add(pr)
    assert pr.phase == PrefillPhase.WAITING and pr.request_id in side.engine.requests
    assert side.waiting.pop_ready(side.engine.step()) == []  # 16 of 40 tokens: no token sampled yet
    assert side.engine.allocator.num_free == 15
    side.prefill(pr)
    assert pr.phase == PrefillPhase.INFLIGHT and not side.waiting
    blocks = side.engine.prefilled_blocks(pr.request_id)
    assert len(blocks) == 3 and side.engine.allocator.num_free == 13

    wait_until(lambda: side.sender.poll(pr.room) == S.SUCCESS, "the receiver's Done")
    assert side.inflight.pop_ended() == []
    assert side.inflight.pop_ready() == [pr] and pr.error is None and "transferred" in pr.t
    # The KV and the aux record are at the peer, in the blocks and slot it named.
    assert side.peer.poll(pr.room) == S.SUCCESS
    assert torch.equal(side.peer.backend.pool[[5, 6, 7]], side.engine.kv_cache.pool[blocks])
    assert side.peer.backend.aux[1].tolist() == [pr.first_token, 0, 40, pr.room, AUX_MAGIC]
    side.peer.release(pr.room)
    assert pr.record is not None and pr.record.t_done is not None
    pr.t["ended"] = time.time()
    assert set(pr.timings()) >= {"bootstrap_s", "queue_s", "prefill_s", "transfer_s", "kv_write_s", "kv_ack_s"}
    assert_freed(side, cached_blocks=2)  # the two full prompt blocks stay cached for later requests


def test_bootstrap_waits_for_an_aux_slot_in_arrival_order(side):
    first, second = side.new(20), side.new(20)
    taken = [side.aux.take(), side.aux.take()]
    for pr, blocks in ((first, [1, 2]), (second, [3, 4])):
        side.bootstrap.add(pr)
        side.destination(pr, blocks, aux_slot=None)
    assert side.bootstrap.pop_ready() == []  # destinations here, but no aux slot
    side.aux.give_back(taken.pop())
    assert side.bootstrap.pop_ready() == [first] and len(side.bootstrap) == 1
    side.aux.give_back(taken.pop())
    assert side.bootstrap.pop_ready() == [second]
    for pr in (first, second):  # end them through the waiting stage, as the decode node gives up
        side.waiting.add(pr)
        side.peer.abort(pr.room, "decode gave up")
    ended: list[PrefillRequest] = []
    wait_until(lambda: ended.extend(side.waiting.pop_ended()) or len(ended) == 2, "both rooms failed")
    assert {pr.request_id for pr in ended} == {first.request_id, second.request_id}
    release_peer(side, first, second)
    assert_freed(side)


def test_abort_in_bootstrap_from_either_side(side):
    ours, theirs = side.new(), side.new()
    side.bootstrap.add(ours)
    side.bootstrap.add(theirs)
    side.destination(theirs, [1, 2, 3])
    side.bootstrap.abort(ours, "aborted by the client")
    side.peer.abort(theirs.room, "client went away")
    assert ours.aborting and len(side.bootstrap) == 2 and side.bootstrap.num_prompt_tokens == 40
    assert side.bootstrap.num_aborting == 1
    ended: list[PrefillRequest] = []
    wait_until(lambda: ended.extend(side.bootstrap.pop_ended()) or len(ended) == 2, "both rooms failed")
    assert ours.error == "aborted by the client"
    assert theirs.error is not None and "aborted by the receiver: client went away" in theirs.error
    assert side.bootstrap.pop_ready() == [] and ours.aux_slot is None and theirs.aux_slot is None
    release_peer(side, theirs)
    assert_freed(side)


def test_bootstrap_timeout(engine):
    side = make_side(engine, bootstrap_timeout_s=0.3)
    try:
        pr = side.new()
        side.bootstrap.add(pr)
        wait_until(lambda: side.bootstrap.pop_ended() == [pr], "the bootstrap timeout")
        assert pr.error is not None and "bootstrap timeout" in pr.error
        assert_freed(side)
    finally:
        side.peer.close()
        side.sender.close()


def test_abort_while_waiting_frees_the_engine_request_at_once(side):
    pr = side.new(40)
    side.bootstrap.add(pr)
    side.destination(pr, [1, 2, 3])
    side.waiting.add(*side.bootstrap.pop_ready())
    side.engine.step()  # the first 16-token chunk: one block held
    assert side.engine.allocator.num_free == 15
    side.waiting.abort(pr, "aborted by the client")
    side.engine.check_block_integrity()
    assert not side.engine.requests  # freed before the room is terminal: no byte of it was moving
    assert side.engine.allocator.num_free + side.engine.prefix_cache.num_evictable_blocks == 16
    assert len(side.waiting) == 1 and side.waiting.num_aborting == 1  # still here until the room fails
    wait_until(lambda: side.waiting.pop_ended() == [pr], "the room to fail")
    assert pr.error == "aborted by the client"
    wait_until(lambda: side.peer.poll(pr.room) == S.FAILED, "the peer to hear")
    assert "aborted by the client" in (side.peer.failure_reason(pr.room) or "")
    side.peer.release(pr.room)
    side.engine.prefix_cache.reset()
    assert_freed(side)


def test_decode_side_gives_up_while_waiting(side):
    pr = side.new(40)
    side.bootstrap.add(pr)
    side.destination(pr, [1, 2, 3])
    side.waiting.add(*side.bootstrap.pop_ready())
    side.engine.step()
    side.peer.abort(pr.room, "decode gave up")
    wait_until(lambda: side.waiting.pop_ended() == [pr], "the room to fail")
    assert pr.error is not None and "aborted by the receiver: decode gave up" in pr.error
    assert pr.request_id not in side.engine.requests and pr.aux_slot is None
    release_peer(side, pr)
    side.engine.prefix_cache.reset()
    assert_freed(side)


def _to_inflight(side: Side, n: int = 40, hold: bool = True) -> PrefillRequest:
    pr = side.new(n)
    side.bootstrap.add(pr)
    side.destination(pr, [1, 2, 3][: -(-n // 16)])
    side.waiting.add(*side.bootstrap.pop_ready())
    side.sender.backend.hold_writes = hold
    side.prefill(pr)
    wait_until(lambda: side.peer.poll(pr.room) == S.TRANSFERRING, "the write to start")
    return pr


@pytest.mark.parametrize("who", ["prefill", "decode"])
def test_abort_inflight_holds_the_blocks_until_the_write_stops(side, who):
    pr = _to_inflight(side)
    held = side.engine.prefilled_blocks(pr.request_id)
    if who == "prefill":
        side.inflight.abort(pr, "aborted by the client")
    else:
        side.peer.abort(pr.room, "client went away")
    # The write may still read the blocks: nothing ends, nothing is freed.
    wait_until(lambda: side.sender.rooms.require(pr.room).aborting, "the abort to reach the sender")
    assert side.inflight.pop_ended() == [] and side.inflight.pop_ready() == []
    assert side.engine.prefilled_blocks(pr.request_id) == held and side.engine.allocator.num_free == 13
    side.sender.backend.hold_writes = False
    assert side.sender.backend.complete_held() == 1
    wait_until(lambda: side.inflight.pop_ended() == [pr], "the room to end")
    expected = "aborted by the client" if who == "prefill" else "aborted by the receiver: client went away"
    assert pr.error is not None and expected in pr.error
    release_peer(side, pr)
    assert_freed(side, cached_blocks=2)  # released, not dropped: the prompt's KV is valid


def test_a_failed_write_ends_the_request(side):
    pr = side.new(40)
    side.bootstrap.add(pr)
    side.destination(pr, [1, 2, 3])
    side.waiting.add(*side.bootstrap.pop_ready())
    side.sender.backend.fail_writes = True
    side.prefill(pr)
    wait_until(lambda: side.inflight.pop_ended() == [pr], "the write to fail")
    side.sender.backend.fail_writes = False
    assert pr.error is not None and "write failed" in pr.error
    release_peer(side, pr)
    assert_freed(side, cached_blocks=2)


def test_a_destination_that_does_not_fit_frees_the_blocks_at_once(side):
    pr = side.new(40)
    side.bootstrap.add(pr)
    side.destination(pr, [1, 2])  # two blocks for a three-block prompt: send() refuses
    side.waiting.add(*side.bootstrap.pop_ready())
    side.prefill(pr)
    assert pr.aborting and pr.request_id not in side.engine.requests  # no byte left: freed now
    wait_until(lambda: side.inflight.pop_ended() == [pr], "the room to fail")
    assert pr.error is not None and pr.error.startswith("KV send failed")
    release_peer(side, pr)
    side.engine.prefix_cache.reset()
    assert_freed(side)


def test_transfer_timeout(engine):
    side = make_side(engine, transfer_timeout_s=0.3)
    try:
        pr = _to_inflight(side)
        wait_until(lambda: side.inflight.pop_ended() == [pr], "the transfer timeout")
        side.sender.backend.hold_writes = False
        assert pr.error is not None and "transfer timeout" in pr.error
        release_peer(side, pr)
        assert_freed(side, cached_blocks=2)
    finally:
        side.peer.close()
        side.sender.close()


def test_early_admission_computes_before_the_destination_and_the_write_waits_armed(side):
    first, second = side.new(40), side.new(20)
    side.bootstrap.add(first)
    side.bootstrap.add(second)
    assert side.bootstrap.pop_ready() == []          # no destination, no early slot: both wait
    assert side.bootstrap.pop_ready(early=1) == [first] and first.aux_slot is not None
    assert len(side.bootstrap) == 1 and second.aux_slot is None   # one slot: the second waits for its destination
    side.waiting.add(first)
    side.prefill(first)
    assert first.phase == PrefillPhase.INFLIGHT
    assert side.sender.poll(first.room) == S.BOOTSTRAPPING       # armed: nothing can move without a destination
    blocks = side.engine.prefilled_blocks(first.request_id)
    side.destination(first, [5, 6, 7], aux_slot=1)                # posted the moment it arrives
    wait_until(lambda: side.sender.poll(first.room) == S.SUCCESS, "the receiver's Done")
    assert side.inflight.pop_ready() == [first] and first.error is None
    assert torch.equal(side.peer.backend.pool[[5, 6, 7]], side.engine.kv_cache.pool[blocks])
    assert side.peer.backend.aux[1].tolist() == [first.first_token, 0, 40, first.room, AUX_MAGIC]
    side.peer.release(first.room)
    first.t["ended"] = time.time()
    assert first.timings()["armed_s"] > 0 and "bootstrap_s" in first.timings()  # armed until the destination came
    side.bootstrap.abort(second, "aborted by the client")
    wait_until(lambda: side.bootstrap.pop_ended() == [second], "the second's room to fail")
    assert_freed(side, cached_blocks=2)


def test_an_early_request_whose_decode_side_never_comes_is_freed_at_the_bootstrap_timeout(engine):
    side = make_side(engine, bootstrap_timeout_s=0.5)
    try:
        pr = side.new(40)
        side.bootstrap.add(pr)
        side.waiting.add(*side.bootstrap.pop_ready(early=1))
        side.prefill(pr)
        wait_until(lambda: side.inflight.pop_ended() == [pr], "the bootstrap timeout")
        assert pr.error is not None and "bootstrap timeout" in pr.error
        assert_freed(side, cached_blocks=2)   # released, not dropped: the prompt's KV is valid
    finally:
        side.peer.close()
        side.sender.close()
