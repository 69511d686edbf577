"""The simulator's parts and a small end-to-end run (seconds, not minutes)."""
from __future__ import annotations

import json

import pytest

from raypd.conductor.prefix_index import PrefixIndex
from raypd.conductor.sim.cache import BlockLRU
from raypd.conductor.sim.nodes import SimDecodeNode
from raypd.conductor.sim.profiles import CPU, GPU
from raypd.conductor.sim.report import oracle_hit_rate, summarize
from raypd.conductor.sim.simulator import Simulation
from raypd.conductor.sim.workload import shared_prefix_workload
from raypd.protocol.block_hash import chained_block_hashes
from raypd.protocol.kv_events import BlockRemoved, BlockStored


def test_lru_evicts_prefix_tails_first_and_publishes_events():
    events = []
    lru = BlockLRU(capacity_blocks=5, block_size=2, emit=events.append)
    a = list(range(0, 8))               # 4 blocks
    b = list(range(100, 106))           # 3 blocks
    ha, hb = chained_block_hashes(a, 2), chained_block_hashes(b, 2)
    assert lru.insert(ha, lambda s, e: a[s * 2:e * 2]) == 4
    assert lru.insert(hb, lambda s, e: b[s * 2:e * 2]) == 3
    # capacity 5: two of a's blocks go, the deepest ones, so a's head still matches
    assert isinstance(events[-1], BlockRemoved) and set(events[-1].block_hashes) == {ha[3], ha[2]}
    assert lru.match(ha) == 2 and lru.match(hb) == 3
    # the index fed with these events agrees with the cache
    idx = PrefixIndex(default_block_size=2)
    idx.add_node("n", 0)
    assert idx.apply("n", events).applied == 3
    assert int(idx.match(a + [0], 1).tokens_by_slot[0]) == 4
    assert [e.seq for e in events] == [1, 2, 3] and isinstance(events[0], BlockStored)


def test_decode_fluid_batching_times():
    from raypd.conductor.sim.nodes import Outcome
    from raypd.conductor.sim.workload import SimRequest

    node = SimDecodeNode("d", "h", CPU, 16, 1)
    outs = [Outcome(SimRequest(f"r{i}", 0.0, 100, 11, (i,), 16)) for i in range(2)]
    for o in outs:
        node.inflight += 1
        node.arrive(o, 0.0)
    step = CPU.decode_step(2, 0.0)
    assert node.next_completion() == pytest.approx(10 * step)
    done = node.advance(1.0)
    assert [o.finished for o in done] == pytest.approx([10 * step] * 2)
    assert outs[0].tpot == pytest.approx(step)


def test_a_local_prompt_takes_its_budget_per_step_then_decodes_in_the_batch():
    from raypd.conductor.sim.nodes import Outcome
    from raypd.conductor.sim.workload import SimRequest

    node = SimDecodeNode("d", "h", CPU, 16, 1, local_budget=32)
    running = Outcome(SimRequest("running", 0.0, 100, 101, (0,), 16))
    node.inflight += 1
    node.arrive(running, 0.0)
    local = Outcome(SimRequest("local", 0.0, 64, 3, (1,), 16))
    node.prefill_locally(local, 0.0)
    assert node.queued_prefill_tokens == 64
    step = CPU.decode_step(1, 0.0) + CPU.prefill_time(32, 0)    # the decode step plus a 32-token chunk
    assert node.next_completion() == pytest.approx(2 * step)     # 64 tokens, 32 a step
    assert node.advance(2 * step) == [] and local.first_token == pytest.approx(2 * step)
    assert node.queued_prefill_tokens == 0 and len(node.running) == 2
    done = node.advance(10.0)
    assert local in done and local.finished == pytest.approx(2 * step + 2 * CPU.decode_step(2, 0.0))


def test_local_path_in_the_simulator_serves_short_prompts_behind_long_ones():
    """Long prompts keep the one prefill node busy; with +local the Conductor lets the decode node
    prefill the short ones, and they reach their first token sooner."""
    from raypd.conductor.sim.workload import SimRequest

    reqs = []
    for i in range(24):
        long_ = i % 3 == 0
        n = 2048 if long_ else 48
        reqs.append(SimRequest(f"r{i}", i * 0.2, n, 8 if long_ else 16, tuple(range(1000 * i, 1000 * i + n // 16 + 1)), 16))
    out = {}
    for policy in ("cost", "cost+local"):
        sim = Simulation(CPU, policy, prefill_nodes=1, decode_nodes=1)
        res = sim.run(reqs)
        assert len(res.outcomes) == len(reqs) and all(o.finished >= o.first_token > o.arrival for o in res.outcomes)
        short = sorted(o.ttft for o in res.outcomes if o.req.input_len < 100)
        out[policy] = (short[len(short) // 2], sim.core.num_local)
    assert out["cost"][1] == 0 and out["cost+local"][1] > 0
    assert out["cost+local"][0] < out["cost"][0]


def test_profiles_in_other_units_keep_times():
    g32 = GPU.in_units_of(32)
    assert g32.prefill_time(100, 50) == pytest.approx(GPU.prefill_time(3200, 1600))
    assert g32.kv_bytes_per_token == 32 * GPU.kv_bytes_per_token


def test_small_run_cost_beats_round_robin_on_shared_prefixes():
    # 16 prefixes of 2048 tokens: more than one node's cache (23k tokens), less than the fleet's
    reqs = shared_prefix_workload(groups=16, prompts_per_group=8, prefix_len=2048, question_len=32,
                                  output_len=8, rate=2.0, seed=1)
    oracle = oracle_hit_rate(reqs, 16, 4 * CPU.prefill_cache_tokens)
    span = reqs[-1].arrival_s
    out = {}
    for policy in ("round_robin", "cost", "cost+migration"):
        res = Simulation(CPU, policy, prefill_nodes=4, decode_nodes=2).run(reqs)
        out[policy] = summarize(res, 2.0, 0.15, span)
        assert out[policy]["completed"] == len(reqs)
    assert out["cost"]["hit_rate"] > out["round_robin"]["hit_rate"] + 0.2
    assert out["cost"]["hit_rate"] <= oracle + 1e-9
    # the Conductor's predictions are what the simulated nodes then really reuse, mostly
    assert out["cost"]["prediction_exact_share"] > 0.8
    assert out["cost"]["ttft_s"]["p50"] < out["round_robin"]["ttft_s"]["p50"]


def test_routing_sim_entry_point_writes_json(tmp_path):
    from raypd.benchmarks.routing_sim import main

    path = tmp_path / "r.json"
    out = main(["--workload", "shared-prefix", "--profile", "cpu", "--groups", "4", "--prompts-per-group", "6",
                "--prefix-len", "256", "--output-len", "4", "--prefill-nodes", "2", "--decode-nodes", "1",
                "--policies", "round_robin,cost", "--json", str(path)])
    saved = json.loads(path.read_text())
    assert set(saved["results"]) == {"round_robin", "cost"} == set(out["summary"])
    assert 0 < saved["workload"]["oracle_hit_rate"] <= saved["workload"]["infinite_cache_hit_rate"] + 1e-9


def test_flex_nodes_in_the_simulator_follow_the_mix_both_ways():
    """+flex: four flex nodes started 2 prefill + 2 decode. A decode-heavy phase (many long answers
    to short prompts: steps past 0.8 x the TPOT SLO) moves a prefill node to decode; a prompt-heavy
    phase after it (long prompts, one-token answers) moves nodes back to prefill. Every request is
    served, and the Conductor's view of each duty ends as the nodes hold it."""
    from raypd.conductor.sim.workload import SimRequest

    reqs = [SimRequest(f"d{i}", i * 0.1, 64, 200, tuple(range(1000 * i, 1000 * i + 5)), 16) for i in range(200)]
    reqs += [SimRequest(f"p{i}", 60.0 + i * 0.4, 3000, 2, tuple(range(10**6 + 1000 * i, 10**6 + 1000 * i + 188)), 16)
             for i in range(100)]
    sim = Simulation(CPU, "cost+local+flex", prefill_nodes=2, decode_nodes=2)
    res = sim.run(reqs)
    assert len(res.outcomes) == len(reqs) and all(o.finished >= o.first_token > o.arrival for o in res.outcomes)
    orders = res.extra["duty_orders"]
    to_decode = [o for o in orders if o["duty"] == "decode"]
    to_prefill = [o for o in orders if o["duty"] == "prefill"]
    assert sim._unfinished == 0                   # each request finished exactly once
    assert to_decode and to_prefill and to_decode[0]["at"] < 60.0 < to_prefill[0]["at"]
    assert all(o["at"] > 60.0 for o in to_prefill)   # no prompt pressure in the decode-heavy phase
    assert "decode steps" in to_decode[0]["reason"] and to_prefill[0]["reason"].startswith("prompt wait")
    status = sim.core.status()["nodes"]
    assert {name: status[name]["duty"] for name in sim.duty} == {name: d.value for name, d in sim.duty.items()}
