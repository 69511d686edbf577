"""`raypd bench tenants`: does tenant fairness keep an interactive tenant's first tokens fast while
another tenant floods the server, without costing goodput? And do priorities do the same without
tenants? (issue 36). One run, two servers of the same flags:

    raypd bench tenants --phase-duration 60 --json tenants.json
    raypd bench tenants --capacity 2 --phase-duration 10 --serve-args "--model DIR --kv-cache-memory 64"

    start raypd serve (server.py) -> warm-up, capacity probe, the plan (phases.py) -> a_alone,
    flood_fair, priority -> stop it -> start raypd serve --no-tenant-fairness -> warm-up, flood_unfair
    -> stop it -> table and JSON (report.py)

Tenant A sends at --a-load x capacity (fixed interval by default), tenant B floods at --b-load x
capacity (Poisson), both the same request shape (--input-len, --output-len). Per phase: A's TTFT
p50/p99 and TPOT p50, B's completed requests and goodput, total goodput under --slo-ttft/--slo-tpot,
429s and 5xx per tenant, and each kind of node's mean step time (step_times.py), from which the
comparison says how much of A's TTFT rise is the dearer shared step (figures.py).

Bounded: each phase sends rate x --phase-duration requests, then waits at most --drain-timeout for A's
and cancels what is still open; every other wait has its timeout. Servers are stopped on every exit
path, Ctrl-C and SIGTERM included, and checked by pid. Traffic goes to 127.0.0.1 only. The exit
status is 0 when every phase ran and both servers stopped cleanly, whatever the must-hold checks
say (they are in the JSON and the table); 1 when a server failed or left processes; 2 for bad flags.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

from raypd.benchmarks.serve.metrics import SLO
from raypd.benchmarks.serve.systems import LaunchError
from raypd.benchmarks.server_runs.interrupts import run_async
from raypd.benchmarks.server_runs.outcome import server_runs
from raypd.benchmarks.tenants import server
from raypd.benchmarks.tenants.capacity import NoCapacity
from raypd.benchmarks.tenants.figures import comparisons
from raypd.benchmarks.tenants.phase_run import PhaseSettings
from raypd.benchmarks.tenants.phases import PlanError
from raypd.benchmarks.tenants.report import format_table, unbounded_notes, write_json
from raypd.benchmarks.tenants.run import Run, RunOptions, on_server
from raypd.benchmarks.tenants.workload import text_source


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raypd bench tenants", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    t = p.add_argument_group("traffic")
    t.add_argument("--phase-duration", type=float, default=60.0, help="seconds of arrivals per phase")
    t.add_argument("--flood-lead", type=float, default=5.0,
                   help="A's first request this many seconds after the phase's start (B's flood fills the queues "
                        "first); the same in every phase")
    t.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds after a phase's arrivals that A's open requests may take; then every request still "
                        "open is cancelled")
    t.add_argument("--capacity", type=float, default=None, metavar="RPS",
                   help="the server's capacity in requests/s (default: measured by a closed-loop probe)")
    t.add_argument("--probe-duration", type=float, default=15.0, help="seconds of the capacity probe")
    t.add_argument("--probe-concurrency", type=int, default=8, help="requests in flight in the capacity probe")
    t.add_argument("--a-load", type=float, default=0.3, help="tenant A's rate as a fraction of capacity")
    t.add_argument("--b-load", type=float, default=4.0, help="tenant B's flood as a multiple of capacity")
    t.add_argument("--a-arrivals", choices=("fixed", "poisson"), default="fixed", help="A's arrival process")
    t.add_argument("--input-len", type=int, default=128, help="prompt tokens of every request")
    t.add_argument("--output-len", type=int, default=32, help="output tokens of every request")
    t.add_argument("--max-inflight", type=int, default=512,
                   help="open requests per tenant at most (the client's bound)")
    t.add_argument("--warmup", type=int, default=2, help="requests sent one at a time to each server before measuring")
    t.add_argument("--seed", type=int, default=0)
    s = p.add_argument_group("SLOs (goodput: requests meeting both)")
    s.add_argument("--slo-ttft", type=float, default=2.0, help="seconds")
    s.add_argument("--slo-tpot", type=float, default=0.25, help="seconds")
    r = p.add_argument_group("run")
    r.add_argument("--serve-args", default="", help="more `raypd serve` flags, the same for both servers")
    r.add_argument("--request-timeout", type=float, default=120.0, help="seconds per request")
    r.add_argument("--sample-every", type=float, default=1.0, help="seconds between reads of the nodes' step times")
    r.add_argument("--idle-timeout", type=float, default=60.0, help="seconds to wait for idle nodes after a phase")
    r.add_argument("--ready-timeout", type=float, default=600.0, help="seconds for a server to start")
    r.add_argument("--log-dir", type=Path, help="where the servers log (default: a temporary folder)")
    r.add_argument("--json", type=Path, help="write the report here")
    return p


def check_args(args) -> None:
    """PlanError for flags that make no run."""
    positive = {"--phase-duration": args.phase_duration, "--drain-timeout": args.drain_timeout,
                "--probe-duration": args.probe_duration, "--a-load": args.a_load, "--b-load": args.b_load,
                "--slo-ttft": args.slo_ttft, "--slo-tpot": args.slo_tpot, "--request-timeout": args.request_timeout,
                "--sample-every": args.sample_every, "--idle-timeout": args.idle_timeout,
                "--ready-timeout": args.ready_timeout}
    bad = [name for name, v in positive.items() if not v > 0]
    if args.capacity is not None and not args.capacity > 0:
        bad.append("--capacity")
    if bad:
        raise PlanError(f"{', '.join(bad)} must be > 0")
    if min(args.probe_concurrency, args.max_inflight, args.input_len, args.output_len) < 1 or args.warmup < 0:
        raise PlanError("--probe-concurrency, --max-inflight, --input-len and --output-len must be >= 1, --warmup >= 0")
    if not 0 <= args.flood_lead < args.phase_duration:
        raise PlanError("--flood-lead must be >= 0 and shorter than --phase-duration")
    if "--no-tenant-fairness" in shlex.split(args.serve_args):
        raise PlanError("--serve-args must not turn fairness off: the benchmark starts one server of each")


def options(args) -> RunOptions:
    settings = PhaseSettings(args.phase_duration, args.drain_timeout, args.request_timeout, args.max_inflight,
                             args.sample_every, args.idle_timeout, SLO(args.slo_ttft, args.slo_tpot))
    return RunOptions(args.capacity, args.probe_duration, args.probe_concurrency, args.a_load, args.b_load,
                      args.a_arrivals, args.flood_lead, args.input_len, args.output_len, args.warmup, args.seed,
                      settings)


def run_config(args, argv: list[str]) -> dict:
    return {"command": "raypd bench tenants " + shlex.join(argv),
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "log_dir"},
            "slo": {"ttft_s": args.slo_ttft, "tpot_s": args.slo_tpot}, "machine_cpus": os.cpu_count(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def build_report(run: Run, config: dict, servers: list[dict], notes: list[str]) -> dict:
    comparison, must = comparisons(run.phases)
    return {"config": config, "capacity": run.capacity.as_json() if run.capacity else None, "phases": run.phases,
            "comparison": comparison, "must_hold": must, "servers": servers,
            "notes": notes + unbounded_notes(run.phases)}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        check_args(args)
        src = text_source()  # the tokenizer, before any server starts
    except (PlanError, OSError) as e:
        print(f"raypd bench tenants: error: {e}", file=sys.stderr)
        return 2
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="raypd-bench-tenants-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    run = Run(options(args), src)
    servers: list[dict] = []
    notes: list[str] = []
    with server_runs("tenants", servers, notes, (LaunchError, NoCapacity, PlanError)) as outcome:
        for fairness in (True, False):
            with server.started(fairness, args.serve_args, log_dir, args.ready_timeout, servers.append) as launched:
                run_async(on_server(run, launched.port, fairness))
    status = outcome.status
    if run.phases:
        report = build_report(run, run_config(args, argv), servers, notes)
        print(format_table(report))
        if args.json:
            write_json(args.json, report)
            print(f"wrote {args.json}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
