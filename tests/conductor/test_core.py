"""ConductorCore: membership, death cleanup, heartbeats, re-sync, prediction bookkeeping, status."""
from __future__ import annotations

import pytest

from raypd.conductor.config import ConductorConfig
from raypd.conductor.core import ConductorCore
from raypd.conductor.errors import HashSchemeMismatch, UnknownNodeError
from raypd.protocol.kv_events import BlockStored
from tests.conductor.helpers import EventMaker, FakeClock, batch, host, load

BS = 16
PROMPT = list(range(300, 400))
PREFIX = PROMPT[:64]


def make(timeout: float = 5.0) -> ConductorCore:
    core = ConductorCore(ConductorConfig(block_size=BS, heartbeat_timeout_s=timeout, decision_log_size=3),
                         clock=FakeClock())
    for name, role in [("p0", "prefill"), ("p1", "prefill"), ("d0", "decode")]:
        core.register_node(name, role, host())
    return core


def test_death_drops_the_nodes_index_entries_at_once():
    core = make()
    core.report_kv_events(batch("p0", EventMaker(BS).stored(PREFIX)))
    assert core.route("r1", PROMPT).predicted_cached_tokens == 64
    assert core.mark_dead("p0", "actor died")
    assert core.index.num_blocks == 0
    d = core.route("r2", PROMPT)
    assert d.prefill_node == "p1" and d.predicted_cached_tokens == 0
    assert core.status()["nodes"]["p0"]["alive"] is False
    with pytest.raises(UnknownNodeError):
        core.report_kv_events(batch("p0"))


def test_missed_heartbeats_remove_a_node_from_routing():
    core = make(timeout=5.0)
    core.report_kv_events(batch("p0", EventMaker(BS).stored(PREFIX)))
    core.clock.advance(3.0)
    core.heartbeat("p1")
    core.report_load(load("d0", "decode"))
    core.clock.advance(3.0)                 # p0 silent for 6 s
    res = core.tick()
    assert res.dead == ["p0"]
    assert core.index.num_blocks == 0
    assert {core.route(f"r{i}", PROMPT).prefill_node for i in range(3)} == {"p1"}


def test_reregistering_a_node_forgets_its_previous_cache():
    core = make()
    core.report_kv_events(batch("p0", EventMaker(BS).stored(PREFIX)))
    core.register_node("p0", "prefill", host())      # the actor restarted
    assert core.index.num_blocks == 0
    # the new incarnation's events start at 1 again and apply cleanly
    r = core.report_kv_events(batch("p0", EventMaker(BS).stored(PREFIX)))
    assert r.applied == 1 and not r.needs_resync


def test_resync_after_a_gap():
    core = make()
    em = EventMaker(BS)
    core.report_kv_events(batch("p0", em.stored(PREFIX)))
    em.seq += 3
    assert core.report_kv_events(batch("p0", em.stored(PROMPT[:96]))).needs_resync
    assert [n.name for n in core.nodes_needing_resync()] == ["p0"]
    snap = EventMaker(BS)
    core.resync("p0", em.seq, [snap.stored(PROMPT[:96])])
    assert core.nodes_needing_resync() == []
    assert core.route("r", PROMPT).predicted_cached_tokens == 96
    assert core.status()["resyncs"] == 1


def test_hash_mismatch_surfaces_to_the_reporting_node():
    core = make()
    with pytest.raises(HashSchemeMismatch):
        core.report_kv_events(batch("p0", BlockStored(1, 0, (99,), tuple(PREFIX[:BS]), BS)))


def test_predicted_vs_delivered_and_status():
    core = make()
    core.report_kv_events(batch("p0", EventMaker(BS).stored(PREFIX)))
    core.report_load(load("p1", queued=10_000))
    d = core.route("r", PROMPT)
    assert (d.prefill_node, d.predicted_cached_tokens) == ("p0", 64)
    assert core.report_delivered("r", 48) == -16
    assert core.report_delivered("r", 48) is None      # counted once
    st = core.status()
    n = st["nodes"]["p0"]
    assert n["routed"] == 1 and n["predicted_hit_rate"] == 0.64 and n["delivered_hit_rate"] == 0.48
    assert n["indexed_blocks"] == 4 and st["index_blocks"] == 4 and st["decisions"] == 1


def test_decision_log_keeps_the_most_recent():
    core = make()
    for i in range(5):
        core.route(f"r{i}", PROMPT)
    assert [d.request_id for d in core.recent_decisions(10)] == ["r2", "r3", "r4"]
    assert core.log.get("r1") is None and core.log.get("r4").request_id == "r4"
    assert "r4" in core.recent_decisions(1)[0].explain()
    assert core.recent_decisions(1)[0].to_dict()["prefill_node"] in ("p0", "p1")


def test_typed_errors_survive_pickling():
    """Ray pickles exceptions raised in the actor; they must come back as the same class."""
    import pickle

    from raypd.conductor.errors import AdmissionRejected

    for e in (AdmissionRejected("r", "ttft", 2.0, 1.0, None), UnknownNodeError("p9"), HashSchemeMismatch("p", 1, 2)):
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and str(back) == str(e)
