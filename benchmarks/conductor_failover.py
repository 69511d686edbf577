"""How fast the Conductor comes back after it dies: until it routes again, and until its predicted
prefix-cache hit rate is what it was before the kill (its index rebuilt from the nodes).

    raypd bench conductor-failover --json bench-results/conductor_failover.json

A local cluster (`--prefill-nodes` + `--decode-nodes`, a Conductor with the cost policy) serves
`--groups` shared-prefix groups (a `--prefix-len`-token system prompt each, `--questions` questions
per group) so the prefill nodes' caches hold every group's prefix. The probe set (one new question
per group) is then routed - route() only, nothing runs - and the predicted cached tokens are
recorded. The Conductor is killed (`ray.kill` with restart allowed, or `--kill sigkill` of its
process) and the probe set is routed every `--poll-s`:
  - `first_route_s`: the first decision after the kill (the restart);
  - `hit_rate_recovered_s`: the first round whose predicted hit rate is back to the pre-kill value
    (nodes re-register within 0.1 s of the restart, and a node with a cache history sends a full
    KV snapshot at once, so no new traffic is needed).
Repeated `--kills` times. Every process started here is stopped by the cluster's stop().
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import statistics
import time
from pathlib import Path

import ray

from raypd.benchmarks.workloads import english_text
from raypd.cluster.client.conductor_router import ConductorRouter
from raypd.cluster.client.request_driver import RequestDriver
from raypd.cluster.launch.local_cluster import ClusterSpec, NodeCluster
from raypd.engine.model.source import resolve_model
from raypd.engine.tokenizer import Tokenizer
from raypd.protocol.sampling_params import SamplingParams


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="raypd bench conductor-failover", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prefill-nodes", type=int, default=2)
    p.add_argument("--decode-nodes", type=int, default=1)
    p.add_argument("--cpus-per-node", type=float, default=0.5)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--questions", type=int, default=2)
    p.add_argument("--prefix-len", type=int, default=256)
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--kill", choices=["ray_kill", "sigkill"], default="ray_kill")
    p.add_argument("--poll-s", type=float, default=0.05)
    p.add_argument("--timeout-s", type=float, default=120.0, help="bound on one recovery")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    return p.parse_args(argv)


def prompts(tokenizer: Tokenizer, args) -> tuple[list[list[int]], list[list[int]]]:
    """(warm-up prompts, probe prompts): per group a shared prefix plus a question."""
    warm: list[list[int]] = []
    probe: list[list[int]] = []
    for g in range(args.groups):
        prefix = tokenizer.encode(english_text(random.Random(args.seed * 1000 + g), args.prefix_len))[:args.prefix_len]
        for q in range(args.questions + 1):
            question = tokenizer.encode(f" Question {q} of group {g}: what happens next?")
            (probe if q == args.questions else warm).append(prefix + question)
    return warm, probe


async def warm_up(driver: RequestDriver, router: ConductorRouter, warm: list[list[int]]) -> None:
    params = SamplingParams(max_tokens=1, temperature=0.0)
    for i, ids in enumerate(warm):  # one at a time: each group's later questions then hit its cache
        route = await router.route(f"warm-{i}", ids)
        async for chunk in driver.generate(f"warm-{i}", ids, params, route.prefill, route.decode):
            if chunk.finished and chunk.error:
                raise RuntimeError(f"warm-up request failed: {chunk.error}")


def hit_rate(conductor, probe: list[list[int]], tag: str, timeout_s: float = 5.0) -> float | None:
    """Predicted cached tokens over prompt tokens for the probe set; None if the Conductor does not answer."""
    try:
        refs = [conductor.route.remote(f"{tag}-{i}", ids) for i, ids in enumerate(probe)]
        decisions = ray.get(refs, timeout=timeout_s)
    except Exception:  # noqa: BLE001 - dead, restarting, or not yet knowing any node
        return None
    return sum(d.predicted_cached_tokens for d in decisions) / sum(len(ids) for ids in probe)


def kill(conductor, how: str) -> None:
    if how == "sigkill":
        os.kill(ray.get(conductor.status.remote(), timeout=30)["pid"], signal.SIGKILL)
    else:
        ray.kill(conductor, no_restart=False)


def one_recovery(conductor, probe, before: float, args, k: int) -> dict:
    t0 = time.monotonic()
    kill(conductor, args.kill)
    first, recovered, n = None, None, 0
    while time.monotonic() - t0 < args.timeout_s:
        rate = hit_rate(conductor, probe, f"after{k}-{n}")
        n += 1
        now = time.monotonic() - t0
        if rate is not None and first is None:
            first = now
        if rate is not None and rate >= before - 1e-9:
            recovered = now
            break
        time.sleep(args.poll_s)
    return {"kill": args.kill, "first_route_s": first, "hit_rate_recovered_s": recovered, "hit_rate_before": before}


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    tokenizer = Tokenizer(resolve_model(None))
    warm, probe = prompts(tokenizer, args)
    spec = ClusterSpec(prefill_nodes=args.prefill_nodes, decode_nodes=args.decode_nodes,
                       cpus_per_node=args.cpus_per_node, policy="cost")
    kills = []
    with NodeCluster.start(spec) as cluster, RequestDriver() as driver:
        router = ConductorRouter(cluster.conductor, cluster.nodes)
        asyncio.run(warm_up(driver, router, warm))
        time.sleep(1.0)  # the last KV events reach the Conductor (every 0.1 s)
        before = hit_rate(cluster.conductor, probe, "before")
        if not before:
            raise RuntimeError(f"the Conductor predicts no cache hit for the warmed prefixes ({before})")
        for k in range(args.kills):
            kills.append(one_recovery(cluster.conductor, probe, before, args, k))
            print(f"kill {k + 1}/{args.kills}: {kills[-1]}")
    done = [x["hit_rate_recovered_s"] for x in kills if x["hit_rate_recovered_s"] is not None]
    result = {
        "benchmark": "conductor_failover", "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "hit_rate_before": before, "kills": kills,
        "first_route_s_median": statistics.median(x["first_route_s"] for x in kills if x["first_route_s"] is not None)
        if any(x["first_route_s"] is not None for x in kills) else None,
        "hit_rate_recovered_s_median": statistics.median(done) if done else None,
        "recovered": len(done),
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k not in ("args", "kills")}, indent=2))
    return result


if __name__ == "__main__":
    main()
