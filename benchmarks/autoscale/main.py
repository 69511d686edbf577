"""`raypd bench autoscale`: does `raypd serve --autoscale` hold the SLOs through a load step, and give
the nodes back afterwards without losing a request? One run:

    raypd bench autoscale --out docs/results/bench_autoscale.json
    raypd bench autoscale --base-rate 0.6 --warm 30 --step 120 --cool 240 --out out.json
    raypd bench autoscale --short                       (seconds per phase: the end-to-end test)

    [calibration: raypd serve --mixed-nodes MIN (no autoscaling) -> warm-up, capacity probe -> stop;
     base rate = --base-load x capacity; skipped when --base-rate is given]
    raypd serve --mixed-nodes MIN --autoscale mixed=MIN:MAX --autoscale-ttft S --autoscale-tpot S
    -> warm-up, /health ok with MIN live -> warm (base rate), step (x --step-factor), cool (base rate),
    open-loop Poisson arrivals; /health read every second -> drain -> stop -> summary, JSON, PNG

Every request is a short streamed chat request (--prompt-words words, exactly --output-len tokens),
so its TTFT and TPOT are measured at the client; it meets the SLO when it got a complete 200 answer
within --slo-ttft and --slo-tpot (the same targets the server is given). Reported (report.py): per
phase attainment, TTFT/TPOT p50/p99 and requests by status; the timeline in --bucket buckets by
arrival (attainment, offered rate, nodes per role live/draining); the recovery time (timeline.py:
from the step's start to the first bucket from which the step's attainment stays at or above the
target); when /health saw the pool grow and shrink (pool.py); lost requests (anything but 200) in
the cool-down, among those open while a node drained, and in all (figures.py). --no-autoscale runs
the same plan on the fixed pool of MIN nodes (the control; give the same --base-rate).

Defaults fit this 2-core VM: 1 to 3 mixed nodes of the default model (SmolLM2-135M), base = 0.4 x
one node's capacity so the step (x3) overloads one node but not three.

Bounded: the plan sends at most 50,000 requests, at most --max-inflight open at once; after the
arrivals the open requests get at most --drain-timeout, then are cancelled; every other wait has its
timeout. Servers are stopped on every exit path, Ctrl-C and SIGTERM included, and checked by pid.
Traffic goes to 127.0.0.1 only. Exit status: 0 when the run completed and every server stopped
cleanly, whatever the must-hold verdicts say (they are in the JSON and the summary); 1 when a
server failed or left processes; 2 for bad flags; 130 when interrupted.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

from raypd.benchmarks.autoscale import server
from raypd.benchmarks.autoscale.plan import PlanError, plan_phases
from raypd.benchmarks.autoscale.plot import plot
from raypd.benchmarks.autoscale.report import build_report, format_summary
from raypd.benchmarks.autoscale.run import Measured, RunOptions, calibrate, load_step
from raypd.benchmarks.serve.metrics import SLO
from raypd.benchmarks.serve.plot import PlotUnavailable
from raypd.benchmarks.serve.systems import LaunchError
from raypd.benchmarks.server_runs.interrupts import run_async
from raypd.benchmarks.server_runs.outcome import server_runs
from raypd.benchmarks.tenants.capacity import Capacity, NoCapacity
from raypd.benchmarks.tenants.report import write_json

# Flags whose default depends on --short: (full run, --short).
TIMED = {"warm": (60.0, 3.0), "step": (120.0, 6.0), "cool": (240.0, 6.0), "bucket": (10.0, 1.5),
         "probe_duration": (15.0, 3.0), "drain_timeout": (60.0, 30.0), "settle_timeout": (180.0, 30.0),
         "request_timeout": (120.0, 60.0)}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raypd bench autoscale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    t = p.add_argument_group("the load step (durations in seconds; defaults: a full run / --short)")
    t.add_argument("--short", action="store_true", help="phases of a few seconds (the end-to-end test)")
    t.add_argument("--warm", type=float, help="the warm phase at the base rate (60 / 3)")
    t.add_argument("--step", type=float, help="the step at --step-factor x the base rate (120 / 6)")
    t.add_argument("--cool", type=float, help="the cool-down at the base rate, where the pool shrinks (240 / 6)")
    t.add_argument("--step-factor", type=float, default=3.0, help="the step's rate over the base rate (default %(default)g)")
    t.add_argument("--base-rate", type=float, metavar="RPS", help="the base rate (default: --base-load x capacity)")
    t.add_argument("--base-load", type=float, default=0.4,
                   help="the base rate as a fraction of one node's capacity, measured by a probe on a server "
                        "that does not autoscale (default %(default)g)")
    t.add_argument("--probe-duration", type=float, help="seconds of the capacity probe (15 / 3)")
    t.add_argument("--probe-concurrency", type=int, default=8, help="requests in flight in the capacity probe (default %(default)d)")
    t.add_argument("--prompt-words", type=int, default=24, help="words of each chat message, about (default %(default)d)")
    t.add_argument("--output-len", type=int, default=32, help="output tokens of every request (default %(default)d)")
    t.add_argument("--max-inflight", type=int, default=256, help="open requests at most, the client's bound (default %(default)d)")
    t.add_argument("--warmup", type=int, default=2, help="requests sent one at a time to each server first (default %(default)d)")
    t.add_argument("--seed", type=int, default=0, help="seeds the arrivals and the prompts (default %(default)d)")
    s = p.add_argument_group("SLOs (the server's autoscaling targets and the client's)")
    s.add_argument("--slo-ttft", type=float, default=2.0, help="seconds (default %(default)g)")
    s.add_argument("--slo-tpot", type=float, default=0.25, help="seconds (default %(default)g)")
    s.add_argument("--attainment", type=float, default=0.9, help="the share of requests that must meet both (default %(default)g)")
    s.add_argument("--recover-within", type=float, default=90.0,
                   help="seconds from the step's start by which attainment must be back, a must-hold "
                        "(default %(default)g)")
    n = p.add_argument_group("the pool")
    n.add_argument("--nodes", default="1:3", metavar="MIN:MAX", help="mixed nodes: started with MIN, scaled within (default %(default)s)")
    n.add_argument("--autoscale-window", type=float, metavar="S", help="passed to raypd serve (default: its own)")
    n.add_argument("--no-autoscale", action="store_true", help="the fixed pool of MIN nodes: the control run")
    n.add_argument("--serve-args", default="", help="more `raypd serve` flags, for every server started")
    r = p.add_argument_group("run")
    r.add_argument("--bucket", type=float, help="seconds per timeline bucket (10 / 1.5)")
    r.add_argument("--sample-every", type=float, default=1.0, help="seconds between /health reads (default %(default)g)")
    r.add_argument("--drain-timeout", type=float, help="seconds the open requests get after the arrivals (60 / 30)")
    r.add_argument("--settle-timeout", type=float,
                   help="seconds to wait for the pool at its minimum before the step (180 / 30)")
    r.add_argument("--request-timeout", type=float, help="seconds per request (120 / 60)")
    r.add_argument("--ready-timeout", type=float, default=600.0, help="seconds for a server to start (default %(default)g)")
    r.add_argument("--log-dir", type=Path, help="where the servers log (default: a temporary folder)")
    r.add_argument("--out", "--json", dest="out", type=Path, help="write the JSON run record here")
    r.add_argument("--plot", type=Path, help="write the picture here (default: the --out path with .png)")
    return p


def resolve(args: argparse.Namespace) -> None:
    """The durations not given take their full-run or --short default."""
    for name, (full, short) in TIMED.items():
        if getattr(args, name) is None:
            setattr(args, name, short if args.short else full)


def parse_nodes(text: str) -> tuple[int, int]:
    least, sep, most = text.partition(":")
    try:
        lo, hi = int(least), int(most)
    except ValueError:
        raise PlanError(f"--nodes must be MIN:MAX, not {text!r}") from None
    if not sep or lo < 1 or hi <= lo:
        raise PlanError(f"--nodes must be MIN:MAX with 1 <= MIN < MAX, not {text!r}")
    return lo, hi


def check_args(args: argparse.Namespace) -> None:
    """PlanError for flags that make no run (after resolve())."""
    positive = {f"--{name.replace('_', '-')}": getattr(args, name) for name in TIMED} | {
        "--step-factor": args.step_factor, "--base-load": args.base_load, "--slo-ttft": args.slo_ttft,
        "--slo-tpot": args.slo_tpot, "--recover-within": args.recover_within, "--sample-every": args.sample_every,
        "--ready-timeout": args.ready_timeout}
    bad = [name for name, v in positive.items() if not v > 0]
    bad += [name for name, v in (("--base-rate", args.base_rate), ("--autoscale-window", args.autoscale_window))
            if v is not None and not v > 0]
    if bad:
        raise PlanError(f"{', '.join(bad)} must be > 0")
    if not 0 < args.attainment <= 1:
        raise PlanError("--attainment must be in (0, 1]")
    if min(args.probe_concurrency, args.max_inflight, args.prompt_words, args.output_len) < 1 or args.warmup < 0:
        raise PlanError("--probe-concurrency, --max-inflight, --prompt-words and --output-len must be >= 1, "
                        "--warmup >= 0")
    if args.no_autoscale and args.base_rate is None:
        raise PlanError("--no-autoscale needs --base-rate (the control runs the autoscaled run's rate)")
    given = {a.split("=", 1)[0] for a in shlex.split(args.serve_args)}
    taken = given & {"--mixed-nodes", "--prefill-nodes", "--decode-nodes", "--autoscale", "--autoscale-ttft",
                     "--autoscale-tpot", "--autoscale-attainment", "--autoscale-window", "--host", "--port"}
    if taken:
        raise PlanError(f"--serve-args must not set {', '.join(sorted(taken))}: the benchmark sets them")
    parse_nodes(args.nodes)


def options(args: argparse.Namespace) -> RunOptions:
    return RunOptions(args.probe_duration, args.probe_concurrency, args.prompt_words, args.output_len, args.warmup,
                      args.seed, args.request_timeout, args.max_inflight, args.drain_timeout, args.sample_every,
                      args.settle_timeout)


def pool_spec(args: argparse.Namespace) -> server.PoolSpec:
    least, most = parse_nodes(args.nodes)
    return server.PoolSpec(least, most, args.slo_ttft, args.slo_tpot, args.autoscale_window, not args.no_autoscale,
                           args.attainment)


def run_config(args: argparse.Namespace, argv: list[str]) -> dict:
    return {"command": "raypd bench autoscale " + shlex.join(argv),
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "log_dir"},
            "slo": {"ttft_s": args.slo_ttft, "tpot_s": args.slo_tpot, "attainment": args.attainment},
            "pool": {"role": server.ROLE, "nodes": args.nodes, "autoscale": not args.no_autoscale},
            "machine_cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        resolve(args)
        check_args(args)
        if args.base_rate is not None:  # the plan's own checks, before anything starts
            plan_phases(args.base_rate, args.step_factor, args.warm, args.step, args.cool, args.seed)
    except PlanError as e:
        print(f"raypd bench autoscale: error: {e}", file=sys.stderr)
        return 2
    pool, o = pool_spec(args), options(args)
    least = {server.ROLE: pool.least}
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="raypd-bench-autoscale-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    servers: list[dict] = []
    notes: list[str] = []
    capacity: Capacity | None = None
    measured: Measured | None = None
    base_rate = args.base_rate
    phases = []
    with server_runs("autoscale", servers, notes, (LaunchError, NoCapacity, PlanError)) as outcome:
        if base_rate is None:
            with server.started("calibration", pool, args.serve_args, log_dir, args.ready_timeout, servers.append,
                                calibration=True) as launched:
                capacity = run_async(calibrate(o, launched.port))
            base_rate = args.base_load * capacity.rps
        phases = plan_phases(base_rate, args.step_factor, args.warm, args.step, args.cool, args.seed)
        label = "autoscale" if pool.autoscale else "fixed"
        with server.started(label, pool, args.serve_args, log_dir, args.ready_timeout, servers.append) as launched:
            measured = run_async(load_step(o, launched.port, phases, least))
    status = outcome.status
    if measured is None or base_rate is None:
        return status
    report = build_report(run_config(args, argv), capacity, base_rate, phases, measured,
                          SLO(args.slo_ttft, args.slo_tpot, args.attainment), least, args.bucket, args.recover_within,
                          servers, notes)
    print(format_summary(report))
    if args.out:
        write_json(args.out, report)
        print(f"wrote {args.out}", file=sys.stderr)
    picture = args.plot or (args.out.with_suffix(".png") if args.out else None)
    if picture:
        try:
            plot(picture, report, f"raypd bench autoscale: {server.ROLE} nodes {args.nodes}"
                                  f"{'' if pool.autoscale else ' (fixed pool)'}, base {base_rate:.3g} req/s, "
                                  f"step x{args.step_factor:g}")
            print(f"wrote {picture}", file=sys.stderr)
        except PlotUnavailable as e:
            print(f"raypd bench autoscale: {e}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
