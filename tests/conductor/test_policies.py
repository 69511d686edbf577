"""Each policy's choice on hand-built states.

Layout: hosts hA and hB under ToR t0, hC under ToR t1 whose uplink is narrow (5 GB/s).
p0, d0 on hA; p1, d1 on hB; p2 on hC. Prefill nodes report 1000 tokens/s; attention term off,
so prefill time = n_new / 1000 s (+5 ms overhead); KV is 100 kB per token.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from raypd.conductor.config import CacheAwareConfig, ConductorConfig, CostConfig
from raypd.conductor.core import ConductorCore
from raypd.conductor.errors import AdmissionRejected, NoCandidateError, UnknownPolicyError
from raypd.conductor.policies import make_policy
from raypd.conductor.topology import Topology
from tests.conductor.helpers import EventMaker, FakeClock, batch, host, load

BS = 16
PROMPT = list(range(5000, 6000))      # 1000 tokens
PREFIX = PROMPT[:960]                 # 60 blocks

TOPO = {
    "defaults": {"host_tor": {"bandwidth": 25, "latency_us": 2}, "tor_spine": {"bandwidth": 100, "latency_us": 1},
                 "same_host": {"bandwidth": 30, "latency_us": 0}},
    "switches": [{"name": "s0", "kind": "spine"}, {"name": "t0", "kind": "tor"}, {"name": "t1", "kind": "tor"}],
    "links": [{"a": "t0", "b": "s0", "bandwidth": 100, "latency_us": 1},
              {"a": "t1", "b": "s0", "bandwidth": 5, "latency_us": 1}],
    "hosts": [{"name": "hA", "tor": "t0"}, {"name": "hB", "tor": "t0"}, {"name": "hC", "tor": "t1"}],
}


def make_core(policy: str, **cfg) -> ConductorCore:
    # Hand-built states: a node holds what its events say, not also what was routed to it before
    # (test_pending_prefixes.py covers that).
    cfg.setdefault("pending_prefixes", False)
    config = ConductorConfig(policy=policy, block_size=BS, cost=CostConfig(
        kv_bytes_per_token=100_000, default_prefill_tokens_per_s=1000.0, attention_coeff=0.0,
        **cfg.pop("cost", {})), **cfg)
    core = ConductorCore(config, Topology.from_dict(TOPO), clock=FakeClock())
    for name, role, h in [("p0", "prefill", "hA"), ("p1", "prefill", "hB"), ("p2", "prefill", "hC"),
                          ("d0", "decode", "hA"), ("d1", "decode", "hB")]:
        core.register_node(name, role, host(h))
        core.report_load(load(name, role, speed=1000.0))
    return core


def hold(core: ConductorCore, node: str, tokens: list[int]) -> None:
    core.report_kv_events(batch(node, EventMaker(BS).stored(tokens)))


def loads(core: ConductorCore, **queued: int) -> None:
    for name, q in queued.items():
        core.report_load(load(name, queued=q, speed=1000.0))


def test_unknown_policy():
    with pytest.raises(UnknownPolicyError):
        make_policy("random_walk", ConductorConfig())


def test_round_robin_rotates_both_pools():
    core = make_core("round_robin")
    hold(core, "p2", PREFIX)
    got = [(d.prefill_node, d.decode_node) for d in (core.route(f"r{i}", PROMPT) for i in range(4))]
    assert got == [("p0", "d0"), ("p1", "d1"), ("p2", "d0"), ("p0", "d1")]


def test_least_loaded_counts_what_it_routed_since_the_report():
    core = make_core("least_loaded")
    loads(core, p0=3000, p1=0, p2=1500)
    d = core.route("r1", PROMPT)
    assert d.prefill_node == "p1" and d.predicted_cached_tokens == 0
    d = core.route("r2", PROMPT)            # p1 now has 1000 routed tokens, p2 1500 queued
    assert d.prefill_node == "p1"
    d = core.route("r3", PROMPT)            # p1 2000 > p2 1500
    assert d.prefill_node == "p2"
    loads(core, p1=0)                       # a report stamped 0 ("now") covers what was routed
    assert core.route("r4", PROMPT).prefill_node == "p1"


def test_cache_aware_threshold_chain():
    core = make_core("cache_aware", cache_aware=CacheAwareConfig(balance_abs_tokens=2000, balance_rel=1.5))
    # no prefix anywhere -> least loaded
    loads(core, p0=500, p1=100, p2=300)
    d = core.route("cold", PROMPT)
    assert (d.branch, d.prefill_node) == ("no_prefix", "p1")
    # the holder is busier but within the imbalance band -> the holder
    hold(core, "p0", PREFIX)
    loads(core, p0=1500, p1=0, p2=0)
    d = core.route("hit", PROMPT)
    assert (d.branch, d.prefill_node, d.predicted_cached_tokens) == ("cache_hit", "p0", 960)
    # the holder is overloaded -> the nearest non-overloaded node (p1 shares p0's ToR), even
    # though p2 is idler
    loads(core, p0=20_000, p1=400, p2=0)
    d = core.route("near", PROMPT)
    assert (d.branch, d.prefill_node) == ("near_cache", "p1")
    # a short match (below min_hit_ratio) is ignored
    loads(core, p0=0, p1=900, p2=800)
    d = core.route("low", PREFIX[:160] + list(range(9000, 10000)))
    assert (d.branch, d.prefill_node) == ("low_hit", "p0")


def test_cost_prefers_the_holder_until_its_queue_costs_more_than_a_fetch():
    core = make_core("cost")
    hold(core, "p0", PREFIX)
    d = core.route("r", PROMPT)
    assert (d.branch, d.prefill_node, d.predicted_cached_tokens) == ("local", "p0", 960)
    c = d.candidates[0]
    assert c.node == "p0" and c.queue_s == 0.0 and c.prefill_s == pytest.approx(0.045)
    # p0: 0.5 s queue + 40 tokens; p1: fetch 960 tokens (~6 ms) + 40 tokens: the fetch wins
    loads(core, p0=500, p1=0, p2=0)
    d = core.route("r2", PROMPT)
    assert (d.branch, d.prefill_node) == ("fetch", "p1")
    assert d.fetch.source == "p0" and d.fetch.num_tokens == 960 and d.fetch.from_tokens == 0
    assert d.predicted_cached_tokens == 960 and d.local_cached_tokens == 0


def test_cost_without_fetch_recomputes_when_the_holder_is_swamped():
    core = make_core("cost", cost={"allow_fetch": False})
    hold(core, "p0", PREFIX)
    loads(core, p0=500, p1=0, p2=0)
    d = core.route("r", PROMPT)
    # waiting 0.5 s beats recomputing 960 tokens (0.96 s)
    assert (d.branch, d.prefill_node) == ("local", "p0")
    loads(core, p0=2000, p1=0, p2=0)
    d = core.route("r2", PROMPT)
    assert d.branch == "recompute" and d.prefill_node in ("p1", "p2") and d.fetch is None
    # the decision records every candidate it compared, cheapest first
    assert [c.ttft_s for c in d.candidates] == sorted(c.ttft_s for c in d.candidates)


def test_cost_fetch_weighs_topology():
    core = make_core("cost")
    hold(core, "p0", PREFIX)
    loads(core, p0=5000, p1=0, p2=0)
    d = core.route("r", PROMPT)
    # p1 and p2 are equally idle, but p2 sits behind a 5 GB/s uplink: 960 x 100 kB takes ~19 ms
    # to reach it, ~4 ms to reach p1
    assert (d.branch, d.prefill_node) == ("fetch", "p1")
    by_node = {c.node: c for c in d.candidates}
    assert by_node["p2"].fetch_s > by_node["p1"].fetch_s + 0.01


def test_decode_by_distance_then_load():
    core = make_core("cost")
    hold(core, "p1", PREFIX)
    d = core.route("r", PROMPT)
    assert (d.prefill_node, d.decode_node) == ("p1", "d1")          # same host as p1
    core.report_load(load("d1", "decode", running=30, step_time_s=0.0))
    loads(core, p1=0)                       # p1's report now covers r
    d = core.route("r2", PROMPT)
    assert (d.prefill_node, d.decode_node) == ("p1", "d0")          # d1 too busy: one hop away
    assert {c.node for c in d.decode_candidates} == {"d0", "d1"}


def test_decode_without_room_is_avoided():
    core = make_core("least_loaded")
    core.report_load(load("d0", "decode", running=0, free_blocks=10, total_blocks=1000))   # 160 tokens
    core.report_load(load("d1", "decode", running=5, free_blocks=900, total_blocks=1000))
    assert core.route("r", PROMPT).decode_node == "d1"


def test_slo_admission_rejects_with_a_typed_error_and_logs_it():
    core = make_core("cost", ttft_slo_s=1.5)
    loads(core, p0=5000, p1=5000, p2=5000)
    with pytest.raises(AdmissionRejected) as e:
        core.route("late", PROMPT)
    assert e.value.reason == "ttft" and e.value.estimate_s > 5.0
    logged = core.recent_decisions(1)[0]
    assert logged.request_id == "late" and logged.rejected == "ttft"
    loads(core, p0=0)
    assert core.route("ok", PROMPT).prefill_node == "p0"


def test_no_decode_node_is_a_typed_error():
    core = make_core("cost")
    core.mark_dead("d0")
    core.mark_dead("d1")
    with pytest.raises(NoCandidateError):
        core.route("r", PROMPT)


def test_mixed_node_serves_both_sides_without_transfer():
    config = replace(ConductorConfig(), block_size=BS)
    core = ConductorCore(config, clock=FakeClock())
    core.register_node("m0", "mixed", host("box"))
    d = core.route("r", PROMPT)
    assert (d.prefill_node, d.decode_node) == ("m0", "m0")
    assert d.candidates[0].send_s == 0.0
