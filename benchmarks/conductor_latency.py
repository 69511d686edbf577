"""Decision latency of the Conductor's real code at cluster scale: ConductorCore.route (hash the
prompt with engine.block_hash, match it in the global prefix index, score every candidate with the
policy, record the decision) on a fleet of --nodes nodes whose caches hold --indexed-blocks distinct
blocks; plus decisions/s and memory per indexed block.

Fleet: --prefill-share of the nodes are prefill nodes, the rest decode, spread over hosts of 8
nodes, 4 hosts per ToR, 2 spines. Each prefill node's cache is built from chains of blocks (16
tokens each): shared system prompts replicated on many nodes, and per-node conversation chains,
until the index holds --indexed-blocks distinct hashes. Every node reports a random load.
Requests: half extend a random indexed chain (a random prefix of it, then new tokens), half are
cold; all are --prompt-tokens long. Between decisions, a few nodes report new loads and KV events
(untimed), so the index and load arrays change while routing.

Reported: p50/p90/p99/max of the whole route() call in wall time and in the thread's CPU time
(on a shared machine the wall-time tail measures the neighbours; the CPU time is the code's own
cost), of route() given the prompt's hashes (an ingress may hash off the Conductor's thread), and
of its parts (hashing the prompt; index
match; the policy), decisions/s on one core, index memory per indexed block (tracemalloc while
building), and the index's (node, block) entries.

    python -m benchmarks.conductor_latency --nodes 1000 --indexed-blocks 1000000 --json out.json
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
import tracemalloc

import numpy as np

from raypd.conductor.config import ConductorConfig
from raypd.conductor.core import ConductorCore
from raypd.conductor.policies import RoutingView
from raypd.conductor.sim.profiles import GPU, build_topology, conductor_config
from raypd.protocol.block_hash import ROOT_HASH, chained_block_hashes
from raypd.protocol.kv_events import BlockStored
from raypd.protocol.messages import HostInfo, KVEventBatch, LoadReport
from raypd.protocol.roles import Role

BS = 16


def parse(argv):
    ap = argparse.ArgumentParser(prog="conductor_latency", description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--indexed-blocks", type=int, default=1_000_000)
    ap.add_argument("--prefill-share", type=float, default=0.5)
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--policies", default="cost,cache_aware,least_loaded,round_robin")
    ap.add_argument("--shared-prompts", type=int, default=64, help="system prompts replicated across nodes")
    ap.add_argument("--no-pending", action="store_true",
                    help="Conductor without pending prefixes (measures what counting routed blocks costs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    return ap.parse_args(argv)


class Fleet:
    """The chains each prefill node caches, as BlockStored events with real engine hashes."""

    def __init__(self, n_prefill: int, target_blocks: int, shared: int, rng: random.Random):
        self.chains: list[list[int]] = []          # token lists of every chain, for request prompts
        self.events: dict[int, list[BlockStored]] = {i: [] for i in range(n_prefill)}
        self.seq = [0] * n_prefill
        next_tok = 1
        total = 0
        shared_chains = []
        for _ in range(shared):   # 512-token system prompts, each on ~5% of the nodes
            toks = list(range(next_tok, next_tok + 512))
            next_tok += 512
            shared_chains.append(toks)
            self.chains.append(toks)
            total += 512 // BS
        for toks in shared_chains:
            ev_hashes = chained_block_hashes(toks, BS)
            for node in rng.sample(range(n_prefill), max(1, n_prefill // 20)):
                self._add(node, ROOT_HASH, ev_hashes, toks)
        node = 0
        while total < target_blocks:   # conversations: a system prompt then 1-4k private tokens
            base = rng.choice(shared_chains)
            n = rng.randrange(64, 256) * BS
            toks = base + list(range(next_tok, next_tok + n))
            next_tok += n
            hashes = chained_block_hashes(toks, BS)
            self.chains.append(toks)
            self._add(node, ROOT_HASH, hashes, toks)
            total += n // BS
            node = (node + 1) % n_prefill

    def _add(self, node: int, parent: int, hashes: list[int], toks: list[int]) -> None:
        self.seq[node] += 1
        self.events[node].append(BlockStored(self.seq[node], parent, tuple(hashes), tuple(toks[:len(hashes) * BS]), BS))


def build_core(args, policy: str, fleet: Fleet | None, rng: random.Random):
    n_prefill = int(args.nodes * args.prefill_share)
    topo, hosts = build_topology(GPU, args.nodes)
    cfg: ConductorConfig = conductor_config(GPU, policy, block_size=BS, pending_prefixes=not args.no_pending)
    core = ConductorCore(cfg, topo, clock=time.time)
    names = []
    for i in range(args.nodes):
        role = Role.PREFILL if i < n_prefill else Role.DECODE
        name = f"{role.value[0]}{i}"
        names.append(name)
        core.register_node(name, role, HostInfo(hosts[(i * 7919) % args.nodes], "", "", 0))
    if fleet is None:
        fleet = Fleet(n_prefill, args.indexed_blocks, args.shared_prompts, rng)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(n_prefill):
        core.report_kv_events(KVEventBatch(names[i], tuple(fleet.events[i])))
    index_bytes = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    for i, name in enumerate(names):
        core.report_load(random_load(name, i < n_prefill, rng))
    return core, names, fleet, index_bytes, n_prefill


def random_load(name: str, prefill: bool, rng: random.Random) -> LoadReport:
    if prefill:
        return LoadReport(name, Role.PREFILL, rng.randrange(0, 40_000), rng.randrange(0, 8), 1, 20_000, 26_000,
                          6000, step_time_s=0.2, prefill_tokens_per_s=rng.uniform(10_000, 14_000))
    return LoadReport(name, Role.DECODE, 0, rng.randrange(0, 4), rng.randrange(0, 64), rng.randrange(1000, 26_000),
                      26_000, 0, inflight=rng.randrange(0, 4), step_time_s=0.02)


def prompts(fleet: Fleet, n: int, length: int, rng: random.Random) -> list[list[int]]:
    out = []
    fresh = 2_000_000_000
    for i in range(n):
        if i % 2 == 0:
            chain = rng.choice(fleet.chains)
            keep = rng.randrange(0, len(chain) // BS + 1) * BS
            head = chain[:min(keep, length)]
        else:
            head = []
        tail = list(range(fresh, fresh + length - len(head)))
        fresh += length
        out.append(head + tail)
    return out


def measure(core: ConductorCore, names: list[str], n_prefill: int, reqs: list[list[int]], rng: random.Random) -> dict:
    total, prehashed, hashing, matching, policy, cpu = [], [], [], [], [], []
    gc.collect()
    gc.disable()   # a collection inside one timed call says nothing about the policy; report it apart
    try:
        for k, toks in enumerate(reqs):
            t0 = time.perf_counter()
            hashes = core.index.hash_prompt(toks)
            t1 = time.perf_counter()
            match = core.index.match(toks, core.registry.num_slots, hashes)
            t2 = time.perf_counter()
            view = RoutingView(f"x{k}", len(toks), match, time.time(), core.table, core.topology,
                               core.prefill_model, core.decode_model, core.config, core._names)
            core.policy.route(view)
            t3 = time.perf_counter()
            c0 = time.thread_time()
            core.route(f"r{k}", toks)       # the whole call, as the actor runs it
            t4 = time.perf_counter()
            cpu.append(time.thread_time() - c0)
            core.route(f"h{k}", toks, block_hashes=hashes)   # with the ingress having hashed
            t5 = time.perf_counter()
            prehashed.append(t5 - t4)
            hashing.append(t1 - t0)
            matching.append(t2 - t1)
            policy.append(t3 - t2)
            total.append(t4 - t3)
            for _ in range(3):   # churn between decisions, untimed
                i = rng.randrange(len(names))
                core.report_load(random_load(names[i], i < n_prefill, rng))
    finally:
        gc.enable()

    def pct(xs):
        a = np.array(xs) * 1e3
        return {"p50_ms": float(np.percentile(a, 50)), "p90_ms": float(np.percentile(a, 90)),
                "p99_ms": float(np.percentile(a, 99)), "max_ms": float(a.max()), "mean_ms": float(a.mean())}

    return {"route": pct(total), "route_cpu": pct(cpu), "route_prehashed": pct(prehashed), "hash_prompt": pct(hashing), "index_match": pct(matching), "policy": pct(policy),
            "decisions_per_s": 1.0 / float(np.mean(total))}


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    results, fleet, memory = {}, None, None
    for policy in args.policies.split(","):
        core, names, fleet, index_bytes, n_prefill = build_core(args, policy, fleet, rng)
        if memory is None:
            memory = {"index_bytes": index_bytes, "indexed_blocks": core.index.num_blocks,
                      "index_entries": core.index.num_entries,
                      "bytes_per_indexed_block": index_bytes / max(core.index.num_blocks, 1),
                      "bytes_per_entry": index_bytes / max(core.index.num_entries, 1)}
            print(f"index: {core.index.num_blocks:,} blocks, {core.index.num_entries:,} (node, block) entries, "
                  f"{index_bytes / 2**20:.0f} MiB, {memory['bytes_per_indexed_block']:.0f} B/block", file=sys.stderr)
        reqs = prompts(fleet, args.requests, args.prompt_tokens, rng)
        res = measure(core, names, n_prefill, reqs, rng)
        results[policy] = res
        r = res["route"]
        print(f"{policy:13s} route p50 {r['p50_ms']:.3f} p99 {r['p99_ms']:.3f} ms (cpu p99 {res['route_cpu']['p99_ms']:.3f}; "
              f"{res['decisions_per_s']:.0f}/s), "
              f"prehashed p99 {res['route_prehashed']['p99_ms']:.3f} ms; "
              f"hash p50 {res['hash_prompt']['p50_ms']:.3f}, match p50 {res['index_match']['p50_ms']:.3f}, "
              f"policy p50 {res['policy']['p50_ms']:.3f} p99 {res['policy']['p99_ms']:.3f} ms", file=sys.stderr)
        del core
    out = {"benchmark": "conductor_latency",
           "command": "python -m benchmarks.conductor_latency " + " ".join(argv if argv is not None else sys.argv[1:]),
           "date": time.strftime("%Y-%m-%d"), "nodes": args.nodes, "prefill_nodes": int(args.nodes * args.prefill_share),
           "prompt_tokens": args.prompt_tokens, "block_size": BS, "requests": args.requests,
           "memory": memory, "results": results, "wall_s": time.perf_counter() - t0}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
