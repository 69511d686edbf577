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
from raypd.protocol.kv_events import KVTier
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


def tier_hold(core: ConductorCore, node: str, *stored: tuple[list[int], KVTier]) -> None:
    """`node` holds these runs, one after the other, each in its tier."""
    e, parent = EventMaker(BS), None
    for tokens, tier in stored:
        core.report_kv_events(batch(node, e.stored(tokens, parent, tier)))
        parent = (parent or []) + tokens


def test_cost_loads_a_tier_hit_when_that_beats_computing_it():
    core = make_core("cost")
    tier_hold(core, "p1", (PREFIX, KVTier.HOST))
    d = core.route("r", PROMPT)
    # p1: 960 x 100 kB loaded at the default 8 GB/s (12 ms) + 40 tokens (45 ms); 1.005 s elsewhere
    assert (d.branch, d.prefill_node, d.decode_node) == ("tier", "p1", "d1")
    assert d.predicted_cached_tokens == 960 and d.local_cached_tokens == 0
    c = d.candidates[0]
    assert (c.node, c.cached_tokens, c.tier_tokens, c.tiers, c.tier_used) == ("p1", 0, 960, {"host": 960}, True)
    assert c.tier_load_s == pytest.approx(0.012) and c.prefill_s == pytest.approx(0.045)
    assert c.ttft_s == pytest.approx(0.012 + 0.045 + c.send_s)
    assert core.status()["nodes"]["p1"]["indexed_tier_blocks"] == {"host": 60, "disk": 0}
    # the node's own figures replace the defaults: 50 kB per token at a measured 2.4 GB/s -> 20 ms
    core.report_load(load("p1", kv_bytes_per_token=50_000, tier_rates={KVTier.HOST: 2.4e9}))
    d = core.route("r2", PROMPT)
    c = d.candidates[0]
    assert (d.branch, c.node, c.tier_load_s) == ("tier", "p1", pytest.approx(0.020))
    text = d.explain()
    assert "cost/tier -> prefill p1, decode d0; cached 960/1000" in text   # d1 decodes r
    assert "P p1: cached 0 tier 960 (host 960) load 20.0 fetch 0 queue 0.0 prefill 45.0" in text
    # with tiers off the same state is a miss
    core = make_core("cost", cost={"use_tiers": False})
    tier_hold(core, "p1", (PREFIX, KVTier.HOST))
    d = core.route("r", PROMPT)
    assert (d.branch, d.predicted_cached_tokens, d.candidates[0].tier_tokens) == ("cold", 0, 0)


def test_cost_loads_a_tier_run_on_top_of_the_pool_run():
    core = make_core("cost")
    tier_hold(core, "p0", (PREFIX[:480], KVTier.POOL), (PREFIX[480:], KVTier.DISK))
    tier_hold(core, "p1", (PREFIX[:480], KVTier.POOL))
    d = core.route("r", PROMPT)
    # p0: 480 x 100 kB from disk at the default 1 GB/s (48 ms) + 40 tokens; p1: 520 tokens (525 ms)
    assert (d.branch, d.prefill_node, d.predicted_cached_tokens, d.local_cached_tokens) == ("tier", "p0", 960, 480)
    c = d.candidates[0]
    assert (c.cached_tokens, c.tiers, c.tier_load_s) == (480, {"disk": 480}, pytest.approx(0.048))


@pytest.mark.parametrize("disk_rate, others_queued, node, branch", [
    (1e9, 0, "p0", "tier"),           # 96 ms to load: p0 at 0.2 + 0.096 + 0.045 s
    (50e6, 0, "p1", "recompute"),     # 1.92 s to load, more than computing: idle p1 computes it (1.005 s)
    (50e6, 300, "p0", "recompute"),   # ... and p0 computes it itself once the others are busier
])
def test_cost_a_slow_tier_loses_to_computing_the_prefix(disk_rate, others_queued, node, branch):
    core = make_core("cost")
    tier_hold(core, "p0", (PREFIX, KVTier.DISK))
    loads(core, p1=others_queued, p2=others_queued)
    core.report_load(load("p0", queued=200, tier_rates={KVTier.DISK: disk_rate}))
    d = core.route("r", PROMPT)
    assert (d.branch, d.prefill_node) == (branch, node)
    p0 = next(c for c in d.candidates if c.node == "p0")
    assert p0.tier_tokens == 960 and p0.tier_load_s == pytest.approx(96e6 / disk_rate)
    assert p0.tier_used is (branch == "tier")
    assert d.predicted_cached_tokens == (960 if branch == "tier" else 0)
    if branch == "recompute":
        assert f"P p0: cached 0 tier 960 (disk 960) load {96e6 / disk_rate * 1e3:.1f} (not used)" in d.explain()


def test_cost_a_pool_hit_beats_an_equal_tier_hit():
    core = make_core("cost", cost={"allow_fetch": False})
    tier_hold(core, "p0", (PREFIX, KVTier.HOST))
    tier_hold(core, "p1", (PREFIX, KVTier.POOL))
    d = core.route("r", PROMPT)
    assert (d.branch, d.prefill_node, d.predicted_cached_tokens) == ("local", "p1", 960)
    p0, p1 = (next(c for c in d.candidates if c.node == n) for n in ("p0", "p1"))
    assert p0.tier_used and p0.ttft_s - p1.ttft_s == pytest.approx(0.012)   # the load, nothing else


def test_a_routed_tier_hit_is_counted_once():
    """Once routed, the prompt is pending on p1's pool: its host copy adds nothing on top."""
    core = make_core("cost", pending_prefixes=True)
    tier_hold(core, "p1", (PREFIX, KVTier.HOST))
    d = core.route("r1", PROMPT)
    assert (d.branch, d.prefill_node, d.predicted_cached_tokens) == ("tier", "p1", 960)
    d = core.route("r2", PROMPT)
    assert (d.branch, d.prefill_node, d.predicted_cached_tokens) == ("local", "p1", 992)
    assert d.candidates[0].tier_tokens == 0


def test_simple_policies_estimate_tier_hits_too():
    core = make_core("least_loaded")
    tier_hold(core, "p0", (PREFIX, KVTier.HOST))
    d = core.route("r", PROMPT)
    assert (d.prefill_node, d.predicted_cached_tokens, d.local_cached_tokens) == ("p0", 960, 0)
    c = d.candidates[0]
    assert c.tier_used and d.est_ttft_s == pytest.approx(0.012 + 0.045 + c.send_s)


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
