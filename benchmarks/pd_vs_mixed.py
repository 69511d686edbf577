"""PD (1 prefill + 1 decode node) against 2 mixed nodes, same machine, same run, same workload:
steady decoders plus bursts of long prompts. The point of PD is that decode TPOT p99 does not inflate
when long prompts arrive, because the decode node never runs a prefill chunk. `pd-local` is the same
PD pair with the Conductor choosing split or local per request (conductor/split_or_local.py);
`adaptive` (`raypd serve --adaptive`) adds nodes that change duty: two flex nodes started as 1 prefill
+ 1 decode that the Conductor's duty planner moves between the duties (conductor/planners/duties.py).

    python -m benchmarks.pd_vs_mixed --json bench-results/pd_vs_mixed.json    (or `raypd bench pd`)

Workload (seeded, shared by both systems): `--decoders` requests always in flight, each a short prompt
generating `--decode-tokens` tokens (a finished one is replaced at once); every `--burst-every` seconds a
burst of `--burst-size` long prompts (`--burst-len` tokens, `--burst-tokens` output tokens). Each actor
gets `--cpus-per-node` Ray CPUs and as many torch threads. Reports TTFT / TPOT / ITL p50 and p99 for the
steady decoders and the bursts separately, the PD handoff breakdown (bootstrap wait, prefill queue,
prefill compute, KV transfer, first decode step) and what a split request's TTFT spends outside the
prefill node's own phases (`ttft_beyond_prefill_p50_ms`), request and token throughput, and goodput:
requests per second that met both `--slo-ttft` and `--slo-tpot`. The first token of a split request
comes from the prefill node (`NodeRequest.early_first_token`) unless `--no-early-first-token`.

`--mix` picks the workloads, each run on every system: bursty (the above), chat (the steady decoders
alone: short prompts only) and long (the bursts alone: long prompts only); a comma list runs several.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import ray

from raypd.benchmarks.workloads import english_text
from raypd.cluster.client.make_router import make_router
from raypd.cluster.client.request_driver import RequestDriver
from raypd.cluster.client.router import Router
from raypd.cluster.launch.local_cluster import ClusterSpec, NodeCluster
from raypd.conductor.config import LocalPrefillConfig
from raypd.engine.model.source import resolve_model
from raypd.engine.tokenizer import Tokenizer
from raypd.protocol.sampling_params import SamplingParams


@dataclass
class Record:
    kind: str            # "decoder" or "burst"
    sent: float
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    error: str | None = None
    timings: dict = field(default_factory=dict)

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.sent

    @property
    def ttft_beyond_prefill(self) -> float | None:
        """A split-path request's TTFT less the prefill node's own phases (bootstrap wait, queue,
        prefill): the Ray call until the prefill node's engine thread took the request (it looks
        between steps), and the first token's way to the caller (one pyzmq hop when the prefill node
        streams it; else the KV transfer and the decode node's next step boundary too). None: local
        path or mixed."""
        t = self.timings
        phases = ("prefill.bootstrap_s", "prefill.queue_s", "prefill.prefill_s")
        return self.ttft - sum(t[k] for k in phases) if all(k in t for k in phases) else None

    @property
    def num_tokens(self) -> int:
        return sum(self.chunk_tokens)

    @property
    def tpot(self) -> float | None:
        n = self.num_tokens
        return (self.chunk_times[-1] - self.chunk_times[0]) / (n - 1) if n > 1 else None

    def itls(self) -> list[float]:
        """Per-token gaps: a chunk carrying k tokens after a gap g counts as k gaps of g/k."""
        out = []
        for (a, b), k in zip(zip(self.chunk_times, self.chunk_times[1:]), self.chunk_tokens[1:]):
            if k:
                out += [(b - a) / k] * k
        return out


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def summarize(records: list[Record], window_s: float, slo_ttft_s: float, slo_tpot_s: float) -> dict:
    out: dict = {"window_s": round(window_s, 2)}
    for kind in ("decoder", "burst"):
        rs = [r for r in records if r.kind == kind and not r.error and r.chunk_times]
        ttft = [r.ttft for r in rs]
        tpot = [r.tpot for r in rs if r.tpot is not None]
        itl = [g for r in rs for g in r.itls()]
        out[kind] = {"requests": len(rs), "errors": sum(1 for r in records if r.kind == kind and r.error),
                     **{f"ttft_p{q}_ms": _ms(pct(ttft, q)) for q in (50, 90, 99)},
                     **{f"tpot_p{q}_ms": _ms(pct(tpot, q)) for q in (50, 99)},
                     **{f"itl_p{q}_ms": _ms(pct(itl, q)) for q in (50, 99)},
                     **{f"ttft_beyond_prefill_p{q}_ms": _ms(pct(beyond, q)) for q in (50, 99)
                        if (beyond := [b for r in rs if (b := r.ttft_beyond_prefill) is not None])},
                     # Where this kind's TTFT tail goes: each handoff phase's p99 over its requests
                     # (the top-level handoff_ms_p50 mixes decoders and bursts).
                     "handoff_ms_p99": {k: _ms(pct(v, 99)) for k, v in sorted(_phases(rs).items())}}
    done = [r for r in records if not r.error and r.chunk_times]
    out["output_tokens_per_s"] = round(sum(r.num_tokens for r in done) / window_s, 1)
    out["requests_per_s"] = round(len(done) / window_s, 3)
    good = [r for r in done if r.ttft <= slo_ttft_s and (r.tpot is None or r.tpot <= slo_tpot_s)]
    out["goodput_rps"] = round(len(good) / window_s, 3)
    out["handoff_ms_p50"] = {k: _ms(statistics.median(v)) for k, v in sorted(_phases(done).items())}
    return out


def _phases(records: list[Record]) -> dict[str, list[float]]:
    """Each handoff phase (Record.timings) -> its seconds over the records that report it."""
    phases: dict[str, list[float]] = {}
    for r in records:
        for k, v in r.timings.items():
            phases.setdefault(k, []).append(v)
    return phases


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000, 1)


MIXES = ("bursty", "chat", "long")


class Workload:
    def __init__(self, tokenizer: Tokenizer, args, mix: str = "bursty"):
        self.mix = mix
        rng = random.Random(args.seed)
        self.short = [tokenizer.encode(english_text(rng, args.decoder_len // 2))[:args.decoder_len]
                      for _ in range(64)]
        self.long = [tokenizer.encode(english_text(rng, args.burst_len))[:args.burst_len] for _ in range(64)]
        self.args = args


async def drive(driver: RequestDriver, router: Router, wl: Workload, duration_s: float
                ) -> tuple[list[Record], float]:
    a = wl.args
    records: list[Record] = []
    t0 = time.monotonic()
    stop_at = t0 + duration_s
    counter = iter(range(10**9))

    async def one(kind: str, ids: list[int], max_tokens: int) -> None:
        n = next(counter)
        rec = Record(kind, time.monotonic())
        records.append(rec)
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        route = await router.route(f"{kind}-{n}", ids)
        async for chunk in driver.generate(f"{kind}-{n}", ids, params, route.prefill, route.decode):
            if chunk.token_ids:
                rec.chunk_times.append(time.monotonic())
                rec.chunk_tokens.append(len(chunk.token_ids))
            if chunk.finished:
                rec.error, rec.timings = chunk.error, chunk.timings

    async def decoder_slot(i: int) -> None:
        k = i
        while time.monotonic() < stop_at:
            await one("decoder", wl.short[k % len(wl.short)], a.decode_tokens)
            k += a.decoders

    async def bursts() -> None:
        k = 0
        await asyncio.sleep(a.burst_every / 2)
        tasks = []
        while time.monotonic() < stop_at:
            for _ in range(a.burst_size):
                tasks.append(asyncio.ensure_future(one("burst", wl.long[k % len(wl.long)], a.burst_tokens)))
                k += 1
            await asyncio.sleep(a.burst_every)
        await asyncio.gather(*tasks)

    steady = [decoder_slot(i) for i in range(a.decoders)] if wl.mix in ("bursty", "chat") else []
    await asyncio.gather(*steady, *([bursts()] if wl.mix in ("bursty", "long") else []))
    return records, time.monotonic() - t0


def run_system(name: str, spec: ClusterSpec, wl: Workload, args) -> dict:
    with NodeCluster.start(spec) as cluster, RequestDriver(early_first_token=args.early_first_token) as driver:
        router = make_router(cluster.conductor, cluster.nodes)
        # Warm-up: one request per node pair, so model first-touch costs stay out of the window.
        asyncio.run(drive_warmup(driver, router, wl, len(cluster.nodes)))
        records, window = asyncio.run(drive(driver, router, wl, args.duration))
        status = ray.get(cluster.conductor.status.remote(), timeout=30) if cluster.conductor is not None else None
    result = summarize(records, window, args.slo_ttft, args.slo_tpot)
    result["system"] = name
    result["mix"] = wl.mix
    if status is not None:   # how often the Conductor let the decode node prefill (warm-up included)
        result["local_decisions"], result["decisions"] = status["local_decisions"], status["decisions"]
        result["duty_orders"] = status.get("duty_orders", [])   # flex nodes moved, when and why
        result["routed"] = {name: n["routed"] for name, n in status["nodes"].items()}   # warm-up included
    return result


async def drive_warmup(driver: RequestDriver, router: Router, wl: Workload, n: int) -> None:
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)

    async def one(i):
        route = await router.route(f"warm-{i}", wl.long[-1 - i])
        async for _ in driver.generate(f"warm-{i}", wl.long[-1 - i], params, route.prefill, route.decode):
            pass
    await asyncio.gather(*(one(i) for i in range(n)))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="raypd bench pd", description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of load per system")
    ap.add_argument("--decoders", type=int, default=8)
    ap.add_argument("--decoder-len", type=int, default=64)
    ap.add_argument("--decode-tokens", type=int, default=96)
    ap.add_argument("--burst-every", type=float, default=8.0)
    ap.add_argument("--burst-size", type=int, default=4)
    ap.add_argument("--burst-len", type=int, default=1024)
    ap.add_argument("--burst-tokens", type=int, default=8)
    ap.add_argument("--cpus-per-node", type=float, default=1.0)
    ap.add_argument("--systems", default="pd,mixed", help="any of pd, mixed, adaptive, pd-local, pd-srpt, mixed-srpt, adaptive-srpt")
    ap.add_argument("--mix", default="bursty", help=f"workloads, a comma list of {', '.join(MIXES)}")
    ap.add_argument("--slo-ttft", type=float, default=5.0, metavar="S", help="goodput: TTFT at most S seconds")
    ap.add_argument("--slo-tpot", type=float, default=0.25, metavar="S", help="goodput: TPOT at most S seconds")
    ap.add_argument("--local-prefill-budget", type=int, default=32, metavar="TOKENS",
                    help="adaptive, pd-local: prompt tokens a decode node computes per step on the local path")
    ap.add_argument("--local-tpot-weight", type=float, default=None, metavar="W",
                    help="adaptive, pd-local: LocalPrefillConfig.tpot_weight (default: the Conductor's)")
    ap.add_argument("--no-early-first-token", dest="early_first_token", action="store_false",
                    help="split path: the first token comes from the decode node once the KV landed, not from the "
                         "prefill node as soon as it is sampled (NodeRequest.early_first_token)")
    ap.add_argument("--transfer-backend", default="nixl")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    tokenizer = Tokenizer(resolve_model(None))
    common = dict(cpus_per_node=args.cpus_per_node, engine_options={"num_blocks": 2048},
                  transfer_options={"backend": args.transfer_backend})
    srpt = common | {"engine_options": {"num_blocks": 2048, "schedule_policy": "srpt"}}

    local: dict = {} if args.local_tpot_weight is None else {"local_prefill": LocalPrefillConfig(
        enabled=True, step_budget_tokens=args.local_prefill_budget, tpot_weight=args.local_tpot_weight)}

    def adaptive(base: dict) -> ClusterSpec:
        return ClusterSpec(prefill_nodes=1, decode_nodes=1, flex=True, policy="cost",
                           local_prefill_budget=args.local_prefill_budget, tpot_target_s=args.slo_tpot,
                           conductor_options=local, **base)
    specs = {"pd": ClusterSpec(prefill_nodes=1, decode_nodes=1, **common),
             "mixed": ClusterSpec(mixed_nodes=2, **common),
             # raypd serve --adaptive --tpot-target <--slo-tpot>: flex nodes (1 prefill + 1 decode to
             # start) whose duties the Conductor moves, and split or local per request; decode counts as
             # pressed (an idle prefill node may take up decode) when its steps pass 0.8 x the target
             "adaptive": adaptive(common),
             # the fixed PD pair with split or local per request only
             "pd-local": ClusterSpec(prefill_nodes=1, decode_nodes=1, policy="cost",
                                     local_prefill_budget=args.local_prefill_budget, conductor_options=local, **common),
             # the same with shortest-remaining-prompt-first admission (engine/scheduler.py) on every node
             "pd-srpt": ClusterSpec(prefill_nodes=1, decode_nodes=1, **srpt),
             "mixed-srpt": ClusterSpec(mixed_nodes=2, **srpt),
             "adaptive-srpt": adaptive(srpt)}
    if unknown := set(args.systems.split(",")) - specs.keys():
        ap.error(f"unknown systems {sorted(unknown)}; known: {', '.join(specs)}")
    mixes = args.mix.split(",")
    if unknown := set(mixes) - set(MIXES):
        ap.error(f"unknown mixes {sorted(unknown)}; known: {', '.join(MIXES)}")
    results = [run_system(s, specs[s], Workload(tokenizer, args, mix), args)
               for mix in mixes for s in args.systems.split(",")]
    report = {"benchmark": "pd_vs_mixed", "machine": f"{platform.processor() or platform.machine()}, "
              f"{__import__('os').cpu_count()} cores", "args": vars(args) | {"json": str(args.json)}, "results": results}
    for r in results:
        print(f"{r['mix']:6s} {r['system']:8s} goodput {r['goodput_rps']} rps  decoder TPOT p50/p99 {r['decoder']['tpot_p50_ms']}/{r['decoder']['tpot_p99_ms']} ms"
              f"  ITL p99 {r['decoder']['itl_p99_ms']} ms  burst TTFT p50/p99 {r['burst']['ttft_p50_ms']}/"
              f"{r['burst']['ttft_p99_ms']} ms  decoder TTFT p50 {r['decoder']['ttft_p50_ms']} ms"
              f"  {r['output_tokens_per_s']} tok/s  errors {r['decoder']['errors'] + r['burst']['errors']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
