"""Split or local per request (conductor/split_or_local.py), on hand-built states: the Conductor's
real core with load reports and KV events written by the test, so each input the choice weighs
(the prefill queue, the decode node's own cache, its running requests, a TBT SLO, KV room, no
prefill node at all) is set on its own and the choice, its explanation and the load it books are
checked."""
from __future__ import annotations

from dataclasses import replace

import pytest

from raypd.conductor.config import ConductorConfig, LocalPrefillConfig
from raypd.conductor.core import ConductorCore
from raypd.conductor.errors import AdmissionRejected, NoCandidateError
from tests.conductor.helpers import EventMaker, FakeClock, batch, host, load

BS = 16
SPEED = 1000.0  # prefill tokens/s of every prefill node
CHAT = list(range(1000, 1064))                  # 64 tokens
DOC = list(range(5000, 6024))                   # 1024 tokens
ON = LocalPrefillConfig(enabled=True, step_budget_tokens=32)


def make(local: LocalPrefillConfig = ON, **config) -> ConductorCore:
    core = ConductorCore(ConductorConfig(block_size=BS, local_prefill=local, **config), clock=FakeClock())
    core.register_node("p0", "prefill", host())
    core.register_node("d0", "decode", host())
    core.report_load(load("p0", "prefill", speed=SPEED))
    core.report_load(load("d0", "decode", speed=0.0))
    return core


def test_short_prompt_goes_local_when_the_prefill_queue_is_long():
    core = make()
    core.report_load(load("p0", "prefill", queued=8192, speed=SPEED))       # ~8 s of queue
    d = core.route("chat", CHAT)
    assert d.path == "local" and d.prefill_node == d.decode_node == "d0"
    assert d.local.chosen and d.local.split_ttft_s > 8.0 > d.est_ttft_s
    assert d.local.steps == 2                                                # 64 tokens, 32 per step
    assert "local on d0" in d.explain() and "L d0:" in d.explain()
    assert core.status()["local_decisions"] == 1
    # Booked on the decode node as queued prompt tokens and a sequence, nothing on p0.
    assert core.table.pending_tokens[core.registry.get("d0").slot] == 64
    assert core.table.pending_tokens[core.registry.get("p0").slot] == 0


def test_a_long_prompt_stays_split_while_the_decode_node_is_busy():
    core = make()
    core.report_load(load("p0", "prefill", queued=2048, speed=SPEED))
    core.report_load(load("d0", "decode", running=16, speed=0.0))
    d = core.route("doc", DOC)
    assert d.path == "split" and d.prefill_node == "p0" and d.decode_node == "d0"
    assert d.local is not None and not d.local.chosen
    assert "stall" in d.local.why and d.local.tpot_cost_s > d.local.split_ttft_s


def test_the_same_long_prompt_goes_local_on_an_idle_decode_node_behind_a_long_queue():
    core = make()
    core.report_load(load("p0", "prefill", queued=16384, speed=SPEED))
    assert core.route("doc", DOC).path == "local"


def test_an_idle_decode_node_saves_the_transfer_and_one_decoding_sequence_prices_it_out():
    # Idle, a decode node's steps are not capped: it prefills as fast as the prefill node, and no
    # KV moves. With one sequence decoding, that sequence's stall outweighs the transfer saved.
    idle = make().route("chat", CHAT)
    assert idle.path == "local" and idle.local.running == 0 and idle.local.tpot_cost_s == 0
    # The chat it took is routed to d0 now: its next prompt is estimated at the capped speed.
    again = make()
    again.route("first", CHAT)
    second = again.route("second", DOC[:64])
    assert second.path == "split" and second.local.steps == 4    # 64 queued + 64 new, 32 a step
    assert second.local.ttft_s > second.local.split_ttft_s and second.local.why == "the split path is faster"
    core = make()
    core.report_load(load("d0", "decode", running=1, speed=0.0))
    busy = core.route("chat", CHAT)
    assert busy.path == "split" and busy.local.tpot_cost_s > 0


def test_the_decode_nodes_own_cache_makes_a_next_turn_local():
    """A chat's next turn finds its previous turn on the decode node that decoded it."""
    core = make()
    core.report_load(load("p0", "prefill", queued=1024, speed=SPEED))
    core.report_load(load("d0", "decode", running=4, speed=0.0))
    history, turn = DOC[:1008], DOC[1008:]
    cold = core.route("cold", history + turn)
    core.report_kv_events(batch("d0", EventMaker(BS).stored(history)))
    warm = core.route("warm", history + turn)
    assert cold.path == "split"
    assert warm.path == "local" and warm.predicted_cached_tokens == 1008 and warm.local.cached_tokens == 1008


def test_a_tbt_slo_keeps_prompts_off_a_decode_node_it_would_break():
    core = make(tbt_slo_s=0.03)   # a step costs ~23 ms at this load; with 32 prompt tokens ~60 ms
    core.report_load(load("p0", "prefill", queued=8192, speed=SPEED))
    core.report_load(load("d0", "decode", running=1, speed=0.0))
    d = core.route("chat", CHAT)
    assert d.path == "split" and "TBT SLO" in d.local.why


def test_tpot_weight_prices_the_running_requests_stall():
    busy = load("d0", "decode", running=8, speed=0.0)
    queue = load("p0", "prefill", queued=300, speed=SPEED)
    paths = {}
    for weight in (0.0, 10.0):
        core = make(replace(ON, tpot_weight=weight))
        core.report_load(queue)
        core.report_load(busy)
        paths[weight] = core.route("chat", CHAT).path
    assert paths == {0.0: "local", 10.0: "split"}


def test_the_stall_counts_whole_for_each_running_request():
    """A local prompt delays every running request's remaining tokens by its prefill: the cost is the
    stall times the sequences decoding, so a short queue at the prefill node keeps a chat prompt split
    on a busy decode node, and only a long one sends it local."""
    costs, paths = {}, {}
    for running in (4, 8):
        for queued in (200, 8192):
            core = make()
            core.report_load(load("p0", "prefill", queued=queued, speed=SPEED))
            core.report_load(load("d0", "decode", running=running, speed=0.0))
            d = core.route("chat", CHAT)
            costs[running], paths[running, queued] = d.local.tpot_cost_s, d.path
    assert costs[8] == pytest.approx(2 * costs[4]) and costs[4] > 4 * len(CHAT) / SPEED * 0.9
    assert paths == {(4, 200): "split", (8, 200): "split", (4, 8192): "local", (8, 8192): "local"}


def test_the_split_path_pays_its_decode_nodes_step_boundaries():
    """The split decode node streams the first token at the end of the step under way (half a step),
    and reserves blocks at the end of the step under way when the request arrives (a step), which a
    prefill done sooner waits for: nothing of it while the decode node idles."""
    assert make().route("chat", CHAT).local.split_handoff_s == 0
    busy = make(replace(ON, tpot_weight=1e9))   # the local path loses: the split estimate is read
    busy.report_load(load("d0", "decode", running=6, speed=0.0))
    busy.report_load(load("p0", "prefill", speed=50 * SPEED))
    d = busy.route("chat", CHAT)
    step = float(busy.decode_model.step_time(6))
    assert d.path == "split" and step > d.est_ttft_s   # a fast prefill is done before the blocks are reserved
    assert d.local.split_handoff_s == pytest.approx(step / 2 + step - d.est_ttft_s)
    assert d.local.split_ttft_s == pytest.approx(step * 1.5)
    # A prompt that takes longer than a step to prefill pays only the half step at the end.
    busy.report_load(load("p0", "prefill", queued=2000, speed=SPEED))
    d = busy.route("long-queue", DOC[:64])
    assert d.est_ttft_s > step and d.local.split_handoff_s == pytest.approx(step / 2)
    assert "handoff" in d.explain()


def test_no_room_on_any_decode_node_means_no_local_candidate():
    core = make()
    core.report_load(load("p0", "prefill", queued=8192, speed=SPEED))
    core.report_load(load("d0", "decode", free_blocks=2, total_blocks=1000, speed=0.0))   # 32 tokens of room
    d = core.route("chat", CHAT)
    assert d.path == "split" and d.local is None


def test_without_prefill_nodes_decode_nodes_serve_alone():
    core = make()
    core.mark_dead("p0", "gone")
    d = core.route("chat", CHAT)
    assert d.path == "local" and d.decode_node == "d0" and d.branch == "no-prefill-node"
    assert d.local.split_ttft_s == float("inf")
    # Off: the old answer, no candidate.
    off = make(LocalPrefillConfig())
    off.mark_dead("p0", "gone")
    with pytest.raises(NoCandidateError):
        off.route("chat", CHAT)


def test_without_prefill_nodes_a_tbt_slo_still_gets_a_clear_answer():
    """The local path is the only one left; past the TBT SLO, admission refuses it (429), no crash."""
    core = make(tbt_slo_s=0.03)
    core.report_load(load("d0", "decode", running=1, speed=0.0))
    core.mark_dead("p0", "gone")
    with pytest.raises(AdmissionRejected) as e:
        core.route("chat", CHAT)
    assert e.value.reason == "tbt" and e.value.decision.path == "local"


def test_a_local_decision_drops_the_policys_arm():
    core = make()
    core.report_load(load("p0", "prefill", queued=8192, speed=SPEED))
    d = core.route("chat", CHAT)
    assert d.path == "local" and d.branch == "local-prefill" and d.fetch is None


def test_off_by_default_and_then_never_weighed():
    core = make(LocalPrefillConfig())
    core.report_load(load("p0", "prefill", queued=8192, speed=SPEED))
    d = core.route("chat", CHAT)
    assert d.path == "split" and d.local is None
    assert ConductorConfig().local_prefill.enabled is False


def test_local_decisions_round_trip_through_to_dict():
    core = make()
    core.report_load(load("p0", "prefill", queued=8192, speed=SPEED))
    d = core.route("chat", CHAT).to_dict()
    assert d["path"] == "local" and d["local"]["node"] == "d0" and d["local"]["chosen"] is True


def test_the_handoff_reads_the_live_decode_node_after_a_restart_on_another_slot():
    """A node that died and came back on another slot is found there, not on its dead slot."""
    core = make(replace(ON, tpot_weight=1e9))
    core.register_node("d1", "decode", host())
    core.mark_dead("d0", "gone")
    core.mark_dead("d1", "gone")
    core.register_node("d0", "decode", host())     # takes d1's freed slot
    core.report_load(load("d0", "decode", running=6, speed=0.0))
    d = core.route("chat", CHAT)
    assert d.decode_node == "d0" and d.local.split_handoff_s > 0   # the live slot's running sequences
