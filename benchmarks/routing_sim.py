"""Routing policies in the simulator: the real ConductorCore (index, policies, migration planner)
routing a replayed or generated workload over simulated prefill and decode nodes (conductor/sim).

Per policy: cache hit rate (local and fetched) against the oracle for the same total capacity,
TTFT / TPOT p50/p90/p99, SLO attainment and goodput (the highest request rate with >= 90% of
requests meeting both SLOs, by a rate sweep), load imbalance (max/mean of per-node queued prefill
tokens, sampled every second), migrations, decision latency.

Workloads:
  trace          the Mooncake FAST'25 conversation trace (--trace PATH); on the gpu profile each
                 512-token trace block is hashed as one 16-token block standing for 512 tokens
                 (--unit 32; costs count real tokens), on the cpu profile lengths are scaled by 1/32
                 (what the CPU engine runs) and blocks are the engine's 16 tokens
  shared-prefix  SGLang-style groups x questions (--groups, --prompts-per-group, --prefix-len, ...)
  hot-prefix     the same with --hot-share of the requests on one group (default 0.5)

    python -m raypd.benchmarks.routing_sim --trace PATH/TO/conversation_trace.jsonl \\
        --prefill-nodes 16 --decode-nodes 16 --sweep --json docs/results/routing_trace_p16.json
    python -m raypd.benchmarks.routing_sim --workload shared-prefix --profile cpu --sweep --json out.json
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from dataclasses import asdict

from raypd.conductor.sim.profiles import PROFILES
from raypd.conductor.sim.report import goodput_sweep, oracle_hit_rate, summarize
from raypd.conductor.sim.simulator import Simulation
from raypd.conductor.sim.workload import load_mooncake_trace, reusable_share, shared_prefix_workload

ALL_POLICIES = "round_robin,least_loaded,cache_aware,cost,cost+migration"


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="routing_sim", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=["trace", "shared-prefix", "hot-prefix"], default=None,
                    help="default: trace when --trace is given, else shared-prefix")
    ap.add_argument("--trace", default=None, help="Mooncake jsonl trace")
    ap.add_argument("--prefill-nodes", type=int, default=16)
    ap.add_argument("--decode-nodes", type=int, default=16)
    ap.add_argument("--policies", default=ALL_POLICIES,
                    help="comma list; a suffix +migration turns on hot-prefix migration, +local the split-or-local "
                         "choice (decode nodes prefill what the Conductor sends them locally), +flex flex nodes whose "
                         "duty the Conductor's planner moves (started as --prefill-nodes / --decode-nodes), "
                         "e.g. cost+local+flex")
    ap.add_argument("--local-prefill-budget", type=int, default=32,
                    help="+local: prompt tokens a decode node computes per step (real tokens)")
    ap.add_argument("--profile", choices=sorted(PROFILES), default="gpu")
    ap.add_argument("--unit", type=int, default=None, help="real tokens per simulated token (trace on gpu: 32)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-requests", type=int, default=None)
    ap.add_argument("--time-scale", type=float, default=1.0,
                    help="rate multiplier of the fixed-rate run (trace: time compression)")
    ap.add_argument("--sweep", action="store_true", help="search the goodput rate per policy")
    ap.add_argument("--sweep-start", type=float, default=None, help="first rate multiplier (default --time-scale)")
    ap.add_argument("--sweep-runs", type=int, default=7)
    ap.add_argument("--slo-ttft", type=float, default=None, help="seconds (default: the profile's)")
    ap.add_argument("--slo-tpot", type=float, default=None, help="seconds (default: the profile's)")
    ap.add_argument("--cache-tokens", type=int, default=None, help="prefix cache per prefill node, real tokens")
    ap.add_argument("--report-interval", type=float, default=0.05, help="s between a node's reports")
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--prompts-per-group", type=int, default=32)
    ap.add_argument("--prefix-len", type=int, default=2048)
    ap.add_argument("--question-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rate", type=float, default=None, help="generated workloads: requests/s at scale 1")
    ap.add_argument("--hot-share", type=float, default=0.5)
    ap.add_argument("--hot-after", type=float, default=0.5,
                    help="hot-prefix: the skew starts after this share of the requests (a warm cluster)")
    ap.add_argument("--no-fetch", action="store_true", help="cost: no Branch B (no pulling a remote prefix)")
    ap.add_argument("--half-life", type=float, default=2.0, help="migration: hit-score half-life, s")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    return ap.parse_args(argv)


def build(args: argparse.Namespace):
    """(requests, profile in simulation units, unit, description)."""
    from dataclasses import replace

    base = PROFILES[args.profile]
    if args.cache_tokens:
        base = replace(base, prefill_cache_tokens=args.cache_tokens)
    workload = args.workload or ("trace" if args.trace else "shared-prefix")
    if workload == "trace":
        if not args.trace:
            raise SystemExit("--workload trace needs --trace PATH")
        unit = args.unit if args.unit is not None else (32 if args.profile == "gpu" else 1)
        # cpu: the engine's lengths (1/32 of the trace, outputs too); gpu: full lengths, hashed
        # at 512-token granularity (the trace has no finer reuse) with each unit token = 32 tokens
        reqs = load_mooncake_trace(args.trace, scale=1 / 32, scale_output=unit == 1, max_requests=args.max_requests)
        desc = {"name": "mooncake-conversation", "path": args.trace, "length_scale": 1 / 32 if unit == 1 else 1.0}
    else:
        unit = args.unit or 1
        n = args.groups * args.prompts_per_group
        rate = args.rate if args.rate is not None else default_rate(base, args, n)
        reqs = shared_prefix_workload(groups=args.groups, prompts_per_group=args.prompts_per_group,
                                      prefix_len=args.prefix_len, question_len=args.question_len,
                                      output_len=args.output_len, rate=rate, block_tokens=args.block_size,
                                      hot_share=args.hot_share if workload == "hot-prefix" else 0.0,
                                      hot_after=args.hot_after, seed=args.seed)
        if args.max_requests:
            reqs = reqs[:args.max_requests]
        desc = {"name": workload, "groups": args.groups, "prompts_per_group": args.prompts_per_group,
                "prefix_len": args.prefix_len, "question_len": args.question_len, "output_len": args.output_len,
                "rate_at_scale_1": rate, "hot_share": args.hot_share if workload == "hot-prefix" else 0.0,
                "hot_after": args.hot_after if workload == "hot-prefix" else None}
    return reqs, base.in_units_of(unit), unit, desc


def default_rate(profile, args, n: int) -> float:
    """A rate at which the prefill pool is about half busy without any cache reuse."""
    tokens = args.prefix_len + args.question_len
    per_req = profile.prefill_time(tokens, 0)
    return 0.5 * args.prefill_nodes / per_req


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    reqs, profile, unit, desc = build(args)
    ttft_slo = args.slo_ttft if args.slo_ttft is not None else profile.ttft_slo_s
    tpot_slo = args.slo_tpot if args.slo_tpot is not None else profile.tpot_slo_s
    bs = args.block_size
    span = max(r.arrival_s for r in reqs) - min(r.arrival_s for r in reqs)
    t0 = time.perf_counter()
    capacity = args.prefill_nodes * profile.prefill_cache_tokens
    workload = {
        **desc, "requests": len(reqs), "span_s_at_scale_1": span,
        "mean_prompt_tokens": unit * sum(r.input_len for r in reqs) / len(reqs),
        "mean_output_tokens": sum(r.output_len for r in reqs) / len(reqs),
        "infinite_cache_hit_rate": reusable_share(reqs, bs),
        "oracle_hit_rate": oracle_hit_rate(reqs, bs, capacity),
        "fleet_cache_tokens": capacity * unit,
    }
    print(f"workload {desc['name']}: {len(reqs)} requests over {span:.0f}s, infinite-cache hit "
          f"{workload['infinite_cache_hit_rate']:.3f}, oracle for {capacity * unit:,} cached tokens "
          f"{workload['oracle_hit_rate']:.3f}", file=sys.stderr)

    from dataclasses import replace

    from raypd.conductor.sim.profiles import conductor_config

    cost_cfg = replace(conductor_config(profile, "cost", block_size=bs).cost, allow_fetch=not args.no_fetch)

    def run(policy: str, scale: float) -> dict:
        sim = Simulation(profile, policy, prefill_nodes=args.prefill_nodes, decode_nodes=args.decode_nodes,
                         block_size=bs, unit=unit, report_interval_s=args.report_interval,
                         config_overrides={"cost": cost_cfg}, migration_overrides={"half_life_s": args.half_life},
                         local_prefill_budget=args.local_prefill_budget)
        s = summarize(sim.run(reqs, time_scale=scale), ttft_slo, tpot_slo, span / scale)
        s["time_scale"] = scale
        print(f"  {policy:15s} x{scale:<7.3g} hit {s['hit_rate']:.3f} attain {s['slo_attainment']:.3f} "
              f"ttft p50/p99 {s['ttft_s']['p50']:.2f}/{s['ttft_s']['p99']:.2f}s imbalance "
              f"{s['load_imbalance_max_over_mean']['mean']:.2f} ({s['sim_wall_s']:.1f}s wall)", file=sys.stderr)
        return s

    def sweep_point(policy: str, fixed: dict, scale: float) -> dict:
        """The sweep starts where the fixed run was: that point is not run twice."""
        return fixed if scale == args.time_scale else run(policy, scale)

    results = {}
    for policy in args.policies.split(","):
        fixed = run(policy, args.time_scale)
        entry = {"fixed": fixed}
        if args.sweep:
            entry["sweep"] = goodput_sweep(functools.partial(sweep_point, policy, fixed),
                                           start=args.sweep_start or args.time_scale, max_runs=args.sweep_runs)
        results[policy] = entry
    out = {
        "benchmark": "routing_sim", "command": "python -m benchmarks.routing_sim " + " ".join(argv or sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"), "wall_s": time.perf_counter() - t0,
        "profile": asdict(profile), "unit_tokens": unit, "block_size": bs,
        "prefill_nodes": args.prefill_nodes, "decode_nodes": args.decode_nodes,
        "slo": {"ttft_s": ttft_slo, "tpot_s": tpot_slo, "attainment": 0.9},
        "cost_allow_fetch": not args.no_fetch, "migration_half_life_s": args.half_life,
        "workload": workload, "results": results,
    }
    out["summary"] = headline(out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=float)
    print(json.dumps(out["summary"], indent=1), file=sys.stderr)
    return out


def headline(out: dict) -> dict:
    """One line per policy: the figures the targets are stated in."""
    rows = {}
    for policy, e in out["results"].items():
        f = e["fixed"]
        rows[policy] = {
            "hit_rate": round(f["hit_rate"], 4),
            "hit_vs_oracle": round(f["hit_rate"] / out["workload"]["oracle_hit_rate"], 3)
            if out["workload"]["oracle_hit_rate"] else None,
            "ttft_p50_s": round(f["ttft_s"]["p50"], 3), "ttft_p99_s": round(f["ttft_s"]["p99"], 3),
            "tpot_p50_s": round(f["tpot_s"]["p50"], 4), "tpot_p99_s": round(f["tpot_s"]["p99"], 4),
            "slo_attainment": round(f["slo_attainment"], 3),
            "imbalance": round(f["load_imbalance_max_over_mean"]["mean"], 2),
            "migrations": f["migrations"]["finished"], "fetches": f["fetches"],
            "local_share": round(f["local_share"], 3),
        }
        if "sweep" in e:
            rows[policy]["goodput_rps"] = round(e["sweep"]["goodput_rps"], 3)
    return rows


if __name__ == "__main__":
    main()
