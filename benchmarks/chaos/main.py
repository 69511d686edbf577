"""`raypd bench chaos`: faults under load. Starts `raypd serve` (Ray Serve, HTTP, NIXL), runs a
seeded list of streaming chat and completion requests (greedy and seeded sampling) once without
faults, then again and again at `--concurrency` for `--duration` seconds while killing a node or the
Conductor every `--kill-every` seconds, drains, and checks every output against the fault-free one.

    raypd bench chaos --duration 180 --prefill-nodes 2 --decode-nodes 2 --kill-every 30 --json chaos.json
    raypd bench chaos --duration 40 --prefill-nodes 1 --decode-nodes 2 --kill-every 15 --targets decode,conductor
    raypd bench chaos --lab --targets host,partition --duration 180 --kill-every 30 --json chaos_lab.json   (root)

With --lab the run happens on a lab of network-namespace hosts (lab_mode.py): a head host (ingress,
Conductor, this run) and 2 prefill + 2 decode hosts in two racks, nodes placed by role; the targets
may then also be `host` (every process of one host SIGKILLed at once; the last live host of a role is
spared, since a lost host stays lost) and `partition` (one host's link down for --partition-s, then
up). The head host is never a target. The report then has host_events: per fault, the streams that
were on the host and when each was served again, and whether a partitioned host's nodes came back.

    start server (systems.py's launcher) -> connect to its Ray cluster (ray_cluster.py) -> the run
    (run.py: fault-free run, chaos run with kills, drain, recoveries, blocks held) -> stop the server
    by process group and by pid, check nothing of it is left -> table and JSON (report.py, with the
    verdict: every request with a live prefill and decode host completed, outputs identical, nothing
    held, partitioned hosts' nodes serving again)

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

from raypd.benchmarks.chaos.lab_mode import LabFaults, LabRun, run_on_lab
from raypd.benchmarks.chaos.ray_cluster import RayCluster, processes_left, wait_for_ray_address
from raypd.benchmarks.chaos.report import format_table, write_json
from raypd.benchmarks.chaos.run import chaos_run
from raypd.benchmarks.chaos.schedule import HOST_TARGETS, ROLES, TARGETS, KillSchedule, parse_targets
from raypd.benchmarks.chaos.workload import ChaosRequest, build_requests
from raypd.benchmarks.serve.systems import Launched, LaunchError, free_port
from raypd.benchmarks.server_runs.interrupts import Terminated, raise_terminated


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raypd bench chaos", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=180.0, help="seconds of load under kills")
    p.add_argument("--prefill-nodes", type=int, default=2)
    p.add_argument("--decode-nodes", type=int, default=2)
    p.add_argument("--kill-every", type=float, default=30.0, help="seconds between kills; the first at this time")
    p.add_argument("--targets", default=",".join(ROLES),
                   help=f"what may be hit, comma-separated: {','.join(TARGETS)} (host and partition need --lab; "
                        "default: every role)")
    p.add_argument("--lab", action="store_true",
                   help="run on a lab of network-namespace hosts (root): a head host and 2 prefill + 2 decode "
                        "hosts in two racks, every raypd node placed by role; removed at the end")
    p.add_argument("--partition-s", type=float, default=20.0, help="seconds a partitioned host's link stays down")
    p.add_argument("--lab-run", type=Path, help=argparse.SUPPRESS)  # set by --lab for the run inside the head host
    p.add_argument("--seed", type=int, default=0, help="the workload and the kill targets")
    p.add_argument("--spare-last-node", action="store_true",
                   help="never kill the last live node of a role (failover only; by default the cluster "
                        "must ride out that node's death too: requests wait for its restart)")
    p.add_argument("--concurrency", type=int, default=6, help="requests in flight")
    p.add_argument("--num-requests", type=int, default=32, help="distinct requests; the chaos run cycles through them")
    p.add_argument("--min-tokens", type=int, default=24, help="max_tokens of each request is drawn from "
                                                             "[--min-tokens, --max-tokens]")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--request-timeout", type=float, default=120.0, help="seconds per request")
    p.add_argument("--recovery-grace", type=float, default=120.0,
                   help="seconds after the run a killed member may still take to recover")
    p.add_argument("--idle-timeout", type=float, default=60.0, help="seconds to wait for every node to be idle")
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds for the server to start")
    p.add_argument("--cpus-per-node", type=float, default=1.0)
    p.add_argument("--max-node-restarts", type=int, default=1000,
                   help="passed to raypd serve; -1 does not pass it (a server without the flag)")
    p.add_argument("--serve-args", default="", help="more `raypd serve` flags")
    p.add_argument("--log-dir", type=Path, help="where the server logs (default: a temporary folder)")
    p.add_argument("--json", type=Path, help="write the report here")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        schedule, requests = _plan(args)
    except ValueError as e:
        print(f"raypd bench chaos: error: {e}", file=sys.stderr)
        return 2
    if args.lab and args.lab_run is None:
        return run_on_lab(argv, args.json)   # builds the lab, runs this command again inside its head host
    lab = LabRun.read(args.lab_run) if args.lab_run is not None else None
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="raypd-bench-chaos-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = serve_command(args, port, lab)
    config = run_config(args, argv, cmd, log_dir, schedule)
    if lab is not None:
        config["lab"] = {"head_ip": lab.head_ip, "ray_address": lab.address,
                         "hosts": [{"name": h.name, "role": h.role, "rack": h.rack, "ip": h.ip} for h in lab.hosts]}
    notes: list[str] = []
    if args.max_node_restarts < 0:
        notes.append("--max-node-restarts was not passed to raypd serve: killed actors restart only if the server "
                     "restarts them by default")
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGTERM, raise_terminated)
    launched: Launched | None = None
    cluster: RayCluster | None = None
    address: str | None = None
    report: dict | None = None
    status = 0
    try:
        print(f"starting raypd serve on 127.0.0.1:{port} (log in {log_dir}/raypd-serve.log) ...", file=sys.stderr,
              flush=True)
        launched = Launched.start("raypd serve", cmd, port, log_dir / "raypd-serve.log")
        launched.wait_ready(args.ready_timeout)
        address = wait_for_ray_address(launched, 60.0)
        cluster = RayCluster(address, launched.proc.pid, lab.netns() if lab is not None else frozenset())
        try:
            cluster.connect()
        except Exception as e:  # noqa: BLE001 - whatever Ray raises, the run cannot go on
            raise LaunchError(f"could not connect to the server's Ray cluster at {address}: {e}") from e
        report = asyncio.run(chaos_run(args, launched, cluster, schedule, requests, notes, config,
                                       LabFaults(lab) if lab is not None else None))
    except LaunchError as e:
        print(f"raypd bench chaos: error: {_explain_launch(str(e))}", file=sys.stderr)
        status = 1
    except (KeyboardInterrupt, Terminated):
        print("raypd bench chaos: interrupted; stopping the server", file=sys.stderr)
        status = 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the clean-up must not be cut short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        left = _stop(launched, cluster, None if lab is not None else address)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if left:
        print(f"raypd bench chaos: processes of the server still alive: {left}", file=sys.stderr)
        status = status or 1
    if report is not None:
        report["processes_left_after"] = left
        if left:
            report["notes"].append(f"processes of the server were still alive after stopping it: {left}")
        print(format_table(report))
        if args.json:
            write_json(args.json, report)
            print(f"wrote {args.json}", file=sys.stderr)
    return status


def _plan(args) -> tuple[KillSchedule, list[ChaosRequest]]:
    """The kill schedule and the request list of these flags; ValueError for flags that make no run."""
    if args.duration <= 0 or args.concurrency < 1 or min(args.prefill_nodes, args.decode_nodes) < 1:
        raise ValueError("--duration, --concurrency and the node counts must be positive")
    if not 1 <= args.min_tokens <= args.max_tokens:
        raise ValueError("need 1 <= --min-tokens <= --max-tokens")
    if importlib.util.find_spec("openai") is None:
        raise ValueError("the openai package is missing (pip install 'raypd[test]')")
    roles = parse_targets(args.targets)
    if set(roles) & set(HOST_TARGETS) and not args.lab:
        raise ValueError("--targets host and partition need the lab (--lab)")
    if args.lab and args.partition_s <= 0:
        raise ValueError("--partition-s must be positive")
    return (KillSchedule(args.duration, args.kill_every, roles, args.seed, args.spare_last_node),
            build_requests(args.num_requests, args.seed, (args.min_tokens, args.max_tokens)))


def run_config(args, argv: list[str], cmd: list[str], log_dir: Path, schedule: KillSchedule) -> dict:
    if "--lab-run" in argv:  # the user's command, not the one --lab runs inside the head host
        at = argv.index("--lab-run")
        argv = argv[:at] + argv[at + 2:]
    return {"command": "raypd bench chaos " + shlex.join(argv), "server_command": "raypd " + shlex.join(cmd[3:]),
            "server_log": str(log_dir / "raypd-serve.log"),
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "planned_kills": [{"t_s": k.t_s, "kind": k.kind} for k in schedule.planned],
            "machine_cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def serve_command(args, port: int, lab: LabRun | None = None) -> list[str]:
    """The server's command; on the lab it joins the lab's Ray and places every node by role (the
    ingress listens on the head host's own loopback, where this run is)."""
    joined = ["--address", lab.address, "--place-by-role", "--no-dashboard"] if lab is not None else []
    cmd = [sys.executable, "-m", "raypd", "serve", *joined, "--host", "127.0.0.1", "--port", str(port),
           "--prefill-nodes", str(args.prefill_nodes), "--decode-nodes", str(args.decode_nodes),
           "--cpus-per-node", str(args.cpus_per_node), "--chaos-hooks"]  # engine_crash kills call crash_engine()
    if args.max_node_restarts >= 0:
        cmd += ["--max-node-restarts", str(args.max_node_restarts)]
    return cmd + shlex.split(args.serve_args)


def _explain_launch(message: str) -> str:
    if "unrecognized arguments" in message and "--max-node-restarts" in message:
        return ("raypd serve has no --max-node-restarts yet (the fault-tolerance features are not in this build); "
                "--max-node-restarts -1 runs without it\n" + message)
    return message


def _stop(launched: Launched | None, cluster: RayCluster | None, address: str | None) -> list[int]:
    """Disconnect from Ray, stop the server's process group and every process seen under it; the pids
    of its processes still alive afterwards (also any naming its Ray cluster's address or session folder)."""
    if cluster is not None:
        try:
            cluster.close()
        except Exception as e:  # noqa: BLE001 - the server must still be stopped
            print(f"raypd bench chaos: disconnecting from Ray failed: {e}", file=sys.stderr)
    if launched is None:
        return []
    left = set(launched.stop())
    if address is not None:  # on the lab (None) its Ray cluster is the lab's, closed with it
        session_dir = cluster.session_dir if cluster is not None else None
        left |= set(processes_left([address, session_dir or ""]))
    print("stopped raypd serve" + (f"; still alive: {sorted(left)}" if left else ""), file=sys.stderr)
    return sorted(left)


if __name__ == "__main__":
    sys.exit(main())
