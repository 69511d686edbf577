"""`raypd bench serve`: serving systems measured over their OpenAI HTTP API, the way `vllm bench
serve` and SGLang's bench_serving measure them: requests at a rate, TTFT / TPOT / ITL / E2E
percentiles, and goodput (requests/s meeting the latency SLOs).

    raypd bench serve --base-url http://127.0.0.1:8000/v1 --dataset random --request-rate 2
    raypd bench serve --systems raypd-pd,raypd-mixed,llamacpp --dataset gsp --sweep \\
        --slo-ttft 2 --slo-tpot 0.25 --json out.json --plot out.png
    raypd bench serve --systems raypd-pd,llamacpp --dataset trace TRACE.jsonl --length-scale 0.03125 --sweep

The KV tier below the pool, with and without, in one run, on 32 conversations whose contexts do not
fit in pools that hold 8 (issue 35; the arithmetic is in systems.py, under raypd-pd-tier):
    raypd bench serve --systems raypd-pd,raypd-pd-tier --dataset multiturn --conversations 32 --turns 4 \\
        --multiturn-system-len 768 --multiturn-user-len 64 --multiturn-output-len 16 --max-concurrency 4 \\
        --raypd-args="--kv-cache-memory 400" --slo-ttft 2 --slo-tpot 0.25 --run-deadline 900 --json tier.json

`--systems` starts each system in turn (systems.py), measures it on the same requests and stops it,
also on failure or Ctrl-C; `--base-url` measures a server already running. Workloads: datasets.py
and trace.py; arrivals: arrivals.py; goodput sweep: sweep.py; JSON layout: report.py. A raypd
system's KV tier figures come from its nodes' stats, read before and after each run (tier/);
`--ray-address` names the Ray cluster of a `--base-url` raypd server for them.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from raypd.benchmarks.serve import arrivals, runner
from raypd.benchmarks.serve.client import Result
from raypd.benchmarks.serve.datasets import (
    TextSource,
    Workload,
    file_dataset,
    gsp_dataset,
    multiturn_dataset,
    random_dataset,
)
from raypd.benchmarks.serve.metrics import SLO, fill_token_counts, summarize
from raypd.benchmarks.serve.report import format_table, system_entry, write_json
from raypd.benchmarks.serve.sweep import sweep
from raypd.benchmarks.serve.systems import SYSTEMS, LaunchError, LaunchOptions, launch
from raypd.benchmarks.serve.tier.node_stats import TierReader, read_routing
from raypd.benchmarks.serve.trace import trace_dataset

DATASETS = ("random", "gsp", "multiturn", "trace")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raypd bench serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    t = p.add_argument_group("target (one of)")
    t.add_argument("--base-url", help="an OpenAI-compatible server already running, e.g. http://127.0.0.1:8000/v1")
    t.add_argument("--systems", help=f"start each in turn on this machine: {','.join(SYSTEMS)}")
    t.add_argument("--label", default="endpoint", help="the name of --base-url in the report")
    t.add_argument("--model", help="model id to send (default: the first of GET /v1/models)")
    t.add_argument("--extra-body", default="{}", help="JSON object merged into every request to --base-url")
    t.add_argument("--ray-address", help="the Ray cluster of --base-url's raypd server (its log's `Ray cluster:` "
                                         "line), to report its KV tier figures")
    t.add_argument("--cpus-per-node", type=float, default=1.0, help="per raypd node; llama-server gets -t 2x this")
    t.add_argument("--raypd-args", default="", help="more `raypd serve` flags for every raypd system")
    t.add_argument("--llamacpp-server", type=Path, help="llama-server binary (default: find or build one, "
                                                          "see llamacpp_build.py)")
    t.add_argument("--llamacpp-parallel", type=int, default=None,
                   help="llama-server slots (default: --max-concurrency, else 16)")
    t.add_argument("--log-dir", type=Path, help="where started systems log (default: a temporary folder)")
    d = p.add_argument_group("workload")
    d.add_argument("--dataset", nargs="+", default=["random"], metavar="NAME [PATH]",
                   help=f"one of {', '.join(DATASETS)}; trace takes the Mooncake jsonl path")
    d.add_argument("--dataset-file", type=Path, help="jsonl of {prompt|messages, max_tokens, timestamp ms}")
    d.add_argument("--num-prompts", type=int, default=64, help="random, trace, file")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--random-input-len", type=int, default=256)
    d.add_argument("--random-output-len", type=int, default=64)
    d.add_argument("--random-range-ratio", type=float, default=0.5)
    d.add_argument("--gsp-groups", type=int, default=8)
    d.add_argument("--gsp-questions", type=int, default=8)
    d.add_argument("--gsp-system-len", type=int, default=1024)
    d.add_argument("--gsp-question-len", type=int, default=32)
    d.add_argument("--gsp-output-len", type=int, default=32)
    d.add_argument("--conversations", type=int, default=16)
    d.add_argument("--turns", type=int, default=4)
    d.add_argument("--multiturn-user-len", type=int, default=64)
    d.add_argument("--multiturn-output-len", type=int, default=32)
    d.add_argument("--multiturn-system-len", type=int, default=0)
    d.add_argument("--length-scale", type=float, default=1 / 32, help="trace: token lengths x this (512 -> 16)")
    d.add_argument("--trace-start", type=int, default=0, help="trace: first line used")
    d.add_argument("--max-model-len", type=int, default=2048, help="trace: cut prompts so prompt+output fit")
    d.add_argument("--default-max-tokens", type=int, default=64, help="file: lines without max_tokens")
    a = p.add_argument_group("arrivals")
    a.add_argument("--request-rate", type=float, default=math.inf,
                   help="requests/s (inf: all at once); for a timed workload it rescales the timestamps")
    a.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps (1 = Poisson)")
    a.add_argument("--time-scale", type=float, default=1.0, help="timed workloads: timestamps / this")
    a.add_argument("--max-concurrency", type=int, default=None, help="at most this many requests in flight")
    s = p.add_argument_group("SLOs and sweep")
    s.add_argument("--slo-ttft", type=float, default=2.0, help="seconds")
    s.add_argument("--slo-tpot", type=float, default=0.25, help="seconds")
    s.add_argument("--slo-attainment", type=float, default=0.9)
    s.add_argument("--sweep", action="store_true", help="find each system's goodput by sweeping the rate")
    s.add_argument("--sweep-rates", help="comma-separated rates (default: double from --request-rate, then bisect)")
    s.add_argument("--sweep-start", type=float, default=0.5, help="first rate of an automatic sweep")
    s.add_argument("--sweep-max-steps", type=int, default=6)
    s.add_argument("--sweep-min-rate", type=float, default=0.0, help="do not halve below this rate")
    s.add_argument("--sweep-refine", type=int, default=1)
    r = p.add_argument_group("run")
    r.add_argument("--warmup", type=int, default=2, help="requests sent (one at a time) before measuring")
    r.add_argument("--request-timeout", type=float, default=120.0)
    r.add_argument("--run-deadline", type=float, default=None,
                   help="seconds after which no new request starts (default: 2x the arrival span + 60)")
    r.add_argument("--json", type=Path)
    r.add_argument("--plot", type=Path)
    return p


class _Terminated(BaseException):
    pass


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if bool(args.base_url) == bool(args.systems):
        print("raypd bench serve: error: give exactly one of --base-url or --systems", file=sys.stderr)
        return 2
    names = [args.label] if args.base_url else [n.strip() for n in args.systems.split(",") if n.strip()]
    unknown = [n for n in names if args.systems and n not in SYSTEMS]
    if unknown:
        print(f"raypd bench serve: error: unknown system(s) {unknown}; known: {', '.join(SYSTEMS)}", file=sys.stderr)
        return 2
    if args.plot:  # fail before minutes of measuring, not after
        from raypd.benchmarks.serve.plot import PlotUnavailable, _pyplot
        try:
            _pyplot()
        except PlotUnavailable as e:
            print(f"raypd bench serve: error: {e}", file=sys.stderr)
            return 2
    try:
        make_workload, encode = workload_builder(args)
        make_workload(0)
    except (ValueError, OSError) as e:
        print(f"raypd bench serve: error: {e}", file=sys.stderr)
        return 2
    slo = SLO(args.slo_ttft, args.slo_tpot, args.slo_attainment)
    signal.signal(signal.SIGTERM, _raise_terminated)
    systems: dict[str, dict] = {}
    runs: dict[str, list[Result]] = {}
    config = run_config(args, argv if argv is not None else sys.argv[1:], make_workload(0), slo)
    try:
        for name in names:
            entry, results = measure_system(name, args, make_workload, encode, slo)
            systems[name], runs[name] = entry, results
            print(format_table(name, entry), flush=True)
            write_outputs(args, config, systems, runs, slo)  # after each system: an interrupted run keeps them
    except (KeyboardInterrupt, _Terminated):
        print("raypd bench serve: interrupted; started systems were stopped", file=sys.stderr)
        return 130
    except LaunchError as e:
        print(f"raypd bench serve: error: {e}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return 0


def write_outputs(args, config: dict, systems: dict[str, dict], runs: dict[str, list[Result]], slo: SLO) -> None:
    if args.json:
        write_json(args.json, config, systems)
    if args.plot:
        from raypd.benchmarks.serve.plot import plot
        plot(args.plot, _title(config), runs, systems, slo.ttft_s, slo.tpot_s, slo.attainment)


def _raise_terminated(signum, frame) -> None:
    raise _Terminated()


def workload_builder(args) -> tuple[Callable[[int], Workload], Callable[[str], list[int]]]:
    """(step -> the workload seeded for that sweep step, the tokenizer's encode)."""
    from transformers import AutoTokenizer

    from raypd.engine.model.source import resolve_model

    hf = AutoTokenizer.from_pretrained(str(resolve_model(None)))

    def encode(text: str) -> list[int]:
        return list(hf.encode(text, add_special_tokens=False))

    def decode(ids: list[int]) -> str:
        return str(hf.decode(ids, skip_special_tokens=True))

    src = TextSource(encode, decode)
    name, rest = args.dataset[0], args.dataset[1:]
    if args.dataset_file is None and name not in DATASETS:
        raise ValueError(f"--dataset {name}: expected one of {', '.join(DATASETS)}")
    if args.dataset_file is None and name == "trace" and len(rest) != 1:
        raise ValueError("--dataset trace takes the trace's path: --dataset trace PATH")
    cache: dict[int, Workload] = {}

    def make(step: int) -> Workload:
        if step in cache:
            return cache[step]
        seed = args.seed + step
        if args.dataset_file is not None:
            w = file_dataset(args.dataset_file, encode, args.default_max_tokens, args.num_prompts)
        elif name == "random":
            w = random_dataset(src, args.num_prompts, args.random_input_len, args.random_output_len,
                               args.random_range_ratio, seed)
        elif name == "gsp":
            w = gsp_dataset(src, args.gsp_groups, args.gsp_questions, args.gsp_system_len, args.gsp_question_len,
                            args.gsp_output_len, seed)
        elif name == "multiturn":
            w = multiturn_dataset(src, args.conversations, args.turns, args.multiturn_user_len,
                                  args.multiturn_output_len, args.multiturn_system_len, seed)
        else:
            w = trace_dataset(Path(rest[0]), src, args.length_scale, args.num_prompts, args.max_model_len,
                              salt=seed, start_index=args.trace_start)
        cache[step] = w
        return w

    return make, encode


def measure_system(name: str, args, make_workload: Callable[[int], Workload], encode, slo: SLO
                   ) -> tuple[dict, list[Result]]:
    """Start the system (unless --base-url), warm it up, run or sweep, stop it; (JSON entry, results of the
    reported run)."""
    launched = None
    if args.base_url:
        target = runner.Target(args.base_url, args.model or "", json.loads(args.extra_body))
    else:
        from raypd.benchmarks.serve.systems import extra_body

        log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="raypd-bench-serve-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        print(f"starting {name} (log in {log_dir}/{name}.log) ...", file=sys.stderr, flush=True)
        launched = launch(name, launch_options(name, args, make_workload(0)), log_dir)
        target = runner.Target(launched.base_url, args.model or "", extra_body(name))
    try:
        ray_address = launched.ray_address() if launched is not None else args.ray_address
        tier = TierReader(ray_address) if ray_address else None
        if not target.model:
            import asyncio
            target = runner.Target(target.base_url, asyncio.run(runner.fetch_model(target.base_url)),
                                   target.extra_body, target.headers)
        warm_up(target, make_workload, args)
        kept: dict[int, list[Result]] = {}

        def measure(rate: float, step: int) -> dict:
            if tier is not None:
                tier.before()
            run = run_once(target, make_workload(step), rate, args, label=f"{name} @ {rate:.3g}/s")
            fill_token_counts(run.results, encode)
            kept[step] = run.results
            s = summarize(run, slo)
            if tier is not None:
                s["kv_tier"] = tier.after()
                if s["kv_tier"] is not None and "error" not in s["kv_tier"]:
                    s["routing"] = read_routing(tier.address)  # how the Conductor priced the tier hits
            print(f"{name} @ {rate:.3g} req/s: {s['slo_attainment']:.0%} met the SLOs, {s['completed']}/{s['requests']} "
                  f"completed, TTFT p99 {s['ttft_p99_s'] or 0:.2f}s, TPOT p99 {s['tpot_p99_s'] or 0:.3f}s",
                  file=sys.stderr, flush=True)
            return s

        if args.sweep:
            rates = [float(x) for x in args.sweep_rates.split(",")] if args.sweep_rates else None
            goodput, steps = sweep(measure, slo.attainment, rates, args.sweep_start, args.sweep_max_steps,
                                   args.sweep_refine, args.sweep_min_rate)
            for i, s in enumerate(steps):
                s["step"] = i
        else:
            s = measure(args.request_rate, 0)
            s["rate"], s["passed"], s["step"] = (None if math.isinf(args.request_rate) else args.request_rate,
                                                 s["slo_attainment"] >= slo.attainment, 0)
            goodput, steps = s["goodput_rps"], [s]
        entry = system_entry(goodput, steps)
        return entry, kept[entry["step"]]
    finally:
        if launched is not None:
            left = launched.stop()
            print(f"stopped {name}" + (f"; processes still alive: {left}" if left else ""), file=sys.stderr)
            if left:
                raise LaunchError(f"{name} left processes behind: {left}")


def launch_options(name: str, args, workload: Workload) -> LaunchOptions:
    llama_server = None
    if name.startswith("llamacpp"):
        if args.llamacpp_server:
            llama_server = args.llamacpp_server
        else:
            from raypd.benchmarks.serve.llamacpp_build import find_or_build_llama_server
            llama_server = find_or_build_llama_server()
    slots = args.llamacpp_parallel or args.max_concurrency or 16
    slot_context = -(-(workload.max_request_tokens() + 128) // 256) * 256  # + the chat template, in 256s
    return LaunchOptions(cpus=args.cpus_per_node, slots=slots, slot_context=slot_context, llama_server=llama_server,
                         raypd_args=tuple(args.raypd_args.split()))


def run_once(target: runner.Target, workload: Workload, rate: float, args, label: str) -> runner.RunResult:
    timed = workload.timed
    if timed and not math.isinf(rate):
        scale = rate / arrivals.native_rate(workload)
        starts = arrivals.session_starts(workload, None, time_scale=scale, use_timestamps=True)
    elif timed:
        starts = arrivals.session_starts(workload, None, time_scale=args.time_scale, use_timestamps=True)
    else:
        starts = arrivals.session_starts(workload, rate, args.burstiness, seed=args.seed)
    deadline = args.run_deadline if args.run_deadline is not None else 2 * max(starts, default=0.0) + 60
    offered = None if math.isinf(rate) else rate
    return runner.run(target, workload, starts, args.max_concurrency, args.request_timeout, deadline, label, offered)


def warm_up(target: runner.Target, make_workload: Callable[[int], Workload], args) -> None:
    """A few requests of an unrelated seed, one at a time, so first-use costs stay out of the figures."""
    if args.warmup <= 0:
        return
    w = make_workload(10_000)
    sessions = [type(s)(s.requests[:1]) for s in w.sessions[:args.warmup]]
    warm = Workload(w.name, sessions)
    runner.run(target, warm, [0.0] * len(sessions), 1, args.request_timeout, None, "warm-up")


def run_config(args, argv: list[str], workload: Workload, slo: SLO) -> dict:
    """The run's settings; input files by name only, so results can be shared without local paths."""
    def public(a: str) -> str:
        return Path(a).name if "/" in a and Path(a).exists() else a
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "log_dir"}
    settings["dataset"] = [public(a) for a in args.dataset]
    if args.dataset_file is not None:
        settings["dataset_file"] = args.dataset_file.name
    inputs = {*args.dataset[1:], str(args.dataset_file)}
    return {"command": "raypd bench serve " + " ".join(public(a) if a in inputs else a for a in argv),
            "settings": settings,
            "workload": {"name": workload.name, "requests": workload.num_requests, **workload.params},
            "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "attainment": slo.attainment},
            "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": _cpus()},
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _cpus() -> int:
    import os
    return os.cpu_count() or 0


def _title(config: dict) -> str:
    w, slo = config["workload"], config["slo"]
    return (f"raypd bench serve: {w['name']} ({w['requests']} requests); SLO TTFT <= {slo['ttft_s']} s, "
            f"TPOT <= {slo['tpot_s']} s, {slo['attainment']:.0%} of requests")


if __name__ == "__main__":
    sys.exit(main())
