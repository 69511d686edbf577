"""`raypd bench soak`: a long run under steady load, watching for leaks. Starts `raypd serve`,
measures its capacity briefly, then offers `--load` x that rate (open loop, Poisson arrivals) for
`--duration` seconds with the official openai client, sampling every process of the server (the
CLI, Ray's daemons, the Serve controller, proxy and replicas, the node actors, the Conductor) for
RSS, open file descriptors and threads, and the nodes' blocks in use, every `--sample-every` s.

    raypd bench soak --duration 600 --load 0.8 --json soak.json --plot soak.png
    raypd bench soak --duration 60 --load 0.8 --warmup 15 --probe-duration 10 --json short.json

    start server (benchmarks/serve/systems.py's launcher) -> the run (run.py: capacity probe, load with
    sampling, drain, blocks held) -> stop the server by process group and by pid, check nothing of it
    is left -> table, JSON and picture (report.py, plot.py)

Must hold (the verdict): no failed request (429s from admission are counted apart, as `rejected`),
no block held once the drain is over, RSS growth below --rss-limit-pct per process after the
warm-up, file descriptors and threads flat: as many at idle after the drain as at idle before the load
(within the tolerances; their growth under load is reported too). The exit status is 0 when the
run completed and the server stopped cleanly, whatever the verdict says (it is in the JSON).
The server is stopped on every exit path, Ctrl-C and SIGTERM included. Traffic goes to 127.0.0.1 only.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path

from raypd.benchmarks.chaos.ray_cluster import processes_left, wait_for_ray_address
from raypd.benchmarks.chaos.report import write_json
from raypd.benchmarks.serve.plot import PlotUnavailable
from raypd.benchmarks.serve.systems import Launched, LaunchError, free_port
from raypd.benchmarks.soak.plot import plot
from raypd.benchmarks.soak.report import format_table
from raypd.benchmarks.soak.run import soak_run


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raypd bench soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    p.add_argument("--load", type=float, default=0.8, help="offered rate as a fraction of the measured capacity")
    p.add_argument("--warmup", type=float, default=None,
                   help="seconds at the start of the load not compared (default: a fifth of --duration, at most 120)")
    p.add_argument("--sample-every", type=float, default=5.0, help="seconds between samples")
    p.add_argument("--tail-samples", type=int, default=6,
                   help="the end of a growth is the mean of this many last samples")
    p.add_argument("--probe-duration", type=float, default=30.0, help="seconds of the capacity probe")
    p.add_argument("--probe-concurrency", type=int, default=8, help="requests in flight in the capacity probe")
    p.add_argument("--max-inflight", type=int, default=64, help="open requests at most during the load")
    p.add_argument("--prefill-nodes", type=int, default=1)
    p.add_argument("--decode-nodes", type=int, default=1)
    p.add_argument("--cpus-per-node", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="the requests and the arrival times")
    p.add_argument("--min-tokens", type=int, default=24, help="max_tokens of each request is drawn from "
                                                             "[--min-tokens, --max-tokens]")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--request-timeout", type=float, default=120.0, help="seconds per request")
    p.add_argument("--idle-timeout", type=float, default=60.0, help="seconds to wait for every node to be idle")
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds for the server to start")
    p.add_argument("--rss-limit-pct", type=float, default=5.0, help="the verdict: RSS growth per process below this")
    p.add_argument("--fds-tolerance", type=int, default=0,
                   help="the verdict: file descriptors flat = idle after the drain - idle before the load, per "
                        "process, at most this")
    p.add_argument("--threads-tolerance", type=int, default=0, help="the verdict: threads flat, the same way")
    p.add_argument("--idle-settle", type=float, default=8.0,
                   help="seconds of quiet before an idle sample (HTTP keep-alive connections close after 5)")
    p.add_argument("--serve-args", default="", help="more `raypd serve` flags")
    p.add_argument("--log-dir", type=Path, help="where the server logs (default: a temporary folder)")
    p.add_argument("--json", type=Path, help="write the report here")
    p.add_argument("--plot", type=Path, help="write the picture (PNG) here; needs matplotlib")
    return p


class _Terminated(BaseException):
    pass


def _raise_terminated(signum, frame) -> None:
    raise _Terminated()


def check_args(args) -> None:
    """ValueError for flags that make no run; fills in the default warm-up."""
    if args.duration <= 0 or not 0 < args.load <= 1.5 or args.sample_every <= 0 or args.probe_duration <= 0:
        raise ValueError("--duration, --sample-every and --probe-duration must be positive and --load in (0, 1.5]")
    if min(args.prefill_nodes, args.decode_nodes, args.probe_concurrency, args.max_inflight, args.tail_samples) < 1:
        raise ValueError("the node counts, --probe-concurrency, --max-inflight and --tail-samples must be >= 1")
    if args.idle_settle < 0 or args.fds_tolerance < 0 or args.threads_tolerance < 0:
        raise ValueError("--idle-settle and the tolerances must be >= 0")
    if not 1 <= args.min_tokens <= args.max_tokens:
        raise ValueError("need 1 <= --min-tokens <= --max-tokens")
    if args.warmup is None:
        args.warmup = min(120.0, args.duration / 5)
    if not 0 <= args.warmup < args.duration - 2 * args.sample_every:
        raise ValueError("--warmup must leave at least two samples of the load after it")
    if importlib.util.find_spec("openai") is None:
        raise ValueError("the openai package is missing (pip install 'raypd[test]')")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise ValueError("--plot needs matplotlib: pip install 'raypd[docs]' (or pip install matplotlib)")


def serve_command(args, port: int) -> list[str]:
    return [sys.executable, "-m", "raypd", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--prefill-nodes", str(args.prefill_nodes), "--decode-nodes", str(args.decode_nodes),
            "--cpus-per-node", str(args.cpus_per_node), *shlex.split(args.serve_args)]


def run_config(args, argv: list[str], cmd: list[str], log_dir: Path) -> dict:
    return {"command": "raypd bench soak " + shlex.join(argv), "server_command": "raypd " + shlex.join(cmd[3:]),
            "server_log": str(log_dir / "raypd-serve.log"), "duration_s": args.duration, "load": args.load,
            "warmup_s": args.warmup, "sample_every_s": args.sample_every, "tail_samples": args.tail_samples,
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "machine_cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        check_args(args)
    except ValueError as e:
        print(f"raypd bench soak: error: {e}", file=sys.stderr)
        return 2
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="raypd-bench-soak-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = serve_command(args, port)
    config = run_config(args, argv, cmd, log_dir)
    notes: list[str] = []
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGTERM, _raise_terminated)
    launched: Launched | None = None
    address: str | None = None
    report: dict | None = None
    status = 0
    try:
        print(f"starting raypd serve on 127.0.0.1:{port} (log in {log_dir}/raypd-serve.log) ...", file=sys.stderr,
              flush=True)
        launched = Launched.start("raypd serve", cmd, port, log_dir / "raypd-serve.log")
        launched.wait_ready(args.ready_timeout)
        address = wait_for_ray_address(launched, 60.0)
        report = asyncio.run(soak_run(args, launched, address, notes, config))
    except (LaunchError, ValueError) as e:  # ValueError: the capacity probe completed nothing
        print(f"raypd bench soak: error: {e}", file=sys.stderr)
        status = 1
    except (KeyboardInterrupt, _Terminated):
        print("raypd bench soak: interrupted; stopping the server", file=sys.stderr)
        status = 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the clean-up must not be cut short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        left = _stop(launched, [address or "", config.get("session_dir") or ""])
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if left:
        print(f"raypd bench soak: processes of the server still alive: {left}", file=sys.stderr)
        status = status or 1
    if report is not None:
        report["processes_left_after"] = left
        if left:
            report["notes"].append(f"processes of the server were still alive after stopping it: {left}")
        print(format_table(report))
        if args.json:
            write_json(args.json, report)
            print(f"wrote {args.json}", file=sys.stderr)
        if args.plot:
            try:
                plot(args.plot, report, f"raypd bench soak: {args.duration:.0f}s at {args.load:g} x capacity "
                                        f"({report['offered_rps']:.2f} req/s), {os.cpu_count()} CPUs")
                print(f"wrote {args.plot}", file=sys.stderr)
            except PlotUnavailable as e:
                print(f"raypd bench soak: {e}", file=sys.stderr)
    return status


def _stop(launched: Launched | None, markers: list[str]) -> list[int]:
    """Stop the server's process group and every process seen under it; the pids still alive afterwards
    (also any naming its Ray cluster's address or session folder)."""
    if launched is None:
        return []
    left = set(launched.stop()) | set(processes_left(markers))
    print("stopped raypd serve" + (f"; still alive: {sorted(left)}" if left else ""), file=sys.stderr)
    return sorted(left)


if __name__ == "__main__":
    sys.exit(main())
