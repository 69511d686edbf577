"""`raypd bench <name> [args]`: run one of the benchmarks in benchmarks/ with its own flags.

    raypd bench serve --systems raypd-pd,llamacpp --dataset gsp --sweep --json out.json
                                            the served system over HTTP against another server
    raypd bench chaos --duration 180 --prefill-nodes 2 --decode-nodes 2 --kill-every 30 --json out.json
                                            nodes and the Conductor killed under load, outputs
                                            checked against a fault-free run
    raypd bench soak --duration 600 --load 0.8 --json out.json --plot out.png
                                            steady load below capacity; every server process's RSS,
                                            fds and threads, blocks held after the drain
    raypd bench tenants --phase-duration 60 --json out.json
                                            an interactive tenant alone and beside another's flood at 4x
                                            capacity, with tenant fairness on and off, and with priorities
    raypd bench autoscale --out out.json    a load step (x3 for 2 minutes, then back) on raypd serve --autoscale:
                                            SLO attainment over time beside the nodes per role, the recovery
                                            time after the step, requests lost while the pool shrinks
    raypd bench pd --json out.json          PD (1 prefill + 1 decode) vs 2 mixed nodes
    raypd bench transfer --json out.json    KV transfer bandwidth and handoff latency (nixl, tcp)
    raypd bench links --out topology.yaml   on a running cluster: KV transfer bandwidth and latency between
                                            every pair of Ray nodes, and the topology file raypd serve --topology reads
    raypd bench engine --json out.json      single-engine throughput vs transformers (and llama.cpp's
                                            server: --systems raypd,hf,llamacpp)
    raypd bench parity --device cuda        greedy tokens against transformers on tiny checkpoints of every
                                            family (float32 identical; bf16 agreement beside transformers')
    raypd bench gpu-smoke --json out.json   on a GPU host: versions, the engine on CUDA against the CPU,
                                            bench engine --device cuda, a 1P+1D generate --mode pd
    raypd bench routing ...                 Conductor policies on a replayed trace (simulator)
    raypd bench conductor ...               Conductor decision latency at scale
    raypd bench conductor-failover ...      how fast a killed Conductor routes again and regains its hit rate
    raypd bench hostile --json out.json     hostile HTTP inputs against one ingress replica: each answer's
                                            delay and the longest pause of a concurrent stream
"""
from __future__ import annotations

import argparse
import importlib

BENCHMARKS = {"pd": "raypd.benchmarks.pd_vs_mixed", "transfer": "raypd.benchmarks.kv_transfer",
              "engine": "raypd.benchmarks.engine_throughput", "routing": "raypd.benchmarks.routing_sim",
              "conductor": "raypd.benchmarks.conductor_latency", "streaming": "raypd.benchmarks.streaming_overhead",
              "serve": "raypd.benchmarks.serve.main", "chaos": "raypd.benchmarks.chaos.main",
              "conductor-failover": "raypd.benchmarks.conductor_failover", "soak": "raypd.benchmarks.soak.main",
              "hostile": "raypd.benchmarks.ingress_hostile", "gpu-smoke": "raypd.benchmarks.gpu_smoke",
              "parity": "raypd.benchmarks.family_parity", "tenants": "raypd.benchmarks.tenants.main",
              "autoscale": "raypd.benchmarks.autoscale.main", "links": "raypd.benchmarks.links.main"}


def add_bench_parser(sub) -> None:
    p = sub.add_parser("bench", help="run a benchmark (serve, chaos, soak, tenants, autoscale, pd, transfer, links, "
                                     "engine, routing, conductor, streaming)", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", choices=sorted(BENCHMARKS))
    p.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own flags (see raypd bench NAME --help)")
    p.set_defaults(run=run_bench)


def run_bench(args) -> int:
    module = importlib.import_module(BENCHMARKS[args.name])
    result = module.main(args.args)
    return result if isinstance(result, int) else 0
