"""`raypd bench links`: KV transfer bandwidth and latency between every pair of Ray nodes of a running
cluster, through kvtransfer's real path, and the topology file `raypd serve --topology` reads.

    raypd bench links --out topology.yaml --json links.json      (on the head, after `ray up`)
    raypd bench links --address HEAD:6379 --backend tcp --bytes 8MiB --out topology.yaml
    raypd serve --topology topology.yaml ...

A probe actor on every alive node (no CPU asked, pinned to its node) owns a KV pool of --bytes in host
memory and the transfer backend `raypd serve` would use (--backend; the data plane secret from
RAYPD_DATA_PLANE_SECRET when set, else a fresh one for this run). For every ordered pair of nodes
(--one-way: every unordered pair once), one after another: --warmup one-block writes, then --reps
one-block writes and --reps writes of the whole pool, each timed from the write posted to the bytes
at the peer; bandwidth is the big write's bytes over its fastest time, latency the small write's
median time (pairs.py). With nixl, each pair also says which UCX transport its writes took
(kvtransfer/nixl/ucx_transport.py): between two machines it must be a network one (tcp, rc, ...), never CMA or
shared memory. A second probe on the first node measures two processes on one machine
(defaults.same_host), unless --no-same-host.

Racks come from the measurement (racks.py: the largest step down in the sorted bandwidths, if at least
--min-gap); Ray's raypd.io/tor label only names them. Hosts are named by IP in the topology file.

Bounded: every wait has a timeout (--timeout per call into a probe); a pair that fails is reported
unreachable with the reason and the run goes on. The probes are closed and killed on every exit path,
Ctrl-C and SIGTERM included. Exit status: 0 when every pair was measured; 1 when a pair or a probe
failed (what was measured is still written); 2 for bad flags or no cluster; 130 when interrupted.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import platform
import re
import shlex
import signal
import sys
import time
from pathlib import Path

from raypd.benchmarks.links.measure import Options, measure
from raypd.benchmarks.links.pairs import Host, WritePlan, undirected
from raypd.benchmarks.links.probe import ProbeSpec
from raypd.benchmarks.links.racks import DEFAULT_MIN_GAP, group
from raypd.benchmarks.links.report import build_report, table
from raypd.benchmarks.links.topology_file import to_yaml, topology_spec
from raypd.benchmarks.server_runs.interrupts import Terminated, raise_terminated
from raypd.cluster.launch.ray_init import RAY_ADDRESS_VARIABLE, init_ray, reason

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(KiB|MiB|GiB)?\s*$")
_UNITS = {None: 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
MAX_POOL_BYTES = 4 << 30


def size(text: str) -> int:
    """Bytes from '4096', '64KiB', '32MiB' or '1GiB'."""
    m = _SIZE.match(text)
    if m is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (bytes, or a number with KiB, MiB or GiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raypd bench links", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--address", help=f"the Ray cluster to measure (default: ${RAY_ADDRESS_VARIABLE}, else auto)")
    p.add_argument("--backend", choices=["nixl", "tcp"], default="nixl", help="the transfer backend (default nixl)")
    p.add_argument("--nixl-backend", choices=["UCX", "LIBFABRIC"], default="UCX", help="as raypd serve's")
    p.add_argument("--nixl-devices", default="", metavar="SPEC", help="as raypd serve's (UCX RDMA devices)")
    p.add_argument("--bytes", type=size, default=size("32MiB"),
                   help="the big write, and each probe's pool (default 32MiB; at most 4GiB)")
    p.add_argument("--block-bytes", type=size, default=size("4KiB"), help="one block: the small write (default 4KiB)")
    p.add_argument("--reps", type=int, default=5, help="timed writes of each size per pair (default 5)")
    p.add_argument("--warmup", type=int, default=3, help="untimed one-block writes first (default 3)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per call into a probe (default 60)")
    p.add_argument("--start-timeout", type=float, default=120.0, help="seconds for the probes to start (default 120)")
    p.add_argument("--one-way", action="store_true", help="each pair of nodes in one direction only")
    p.add_argument("--no-same-host", action="store_true", help="skip the two processes on one machine")
    p.add_argument("--min-gap", type=float, default=DEFAULT_MIN_GAP,
                   help=f"the smallest step down in bandwidth that separates racks (default {DEFAULT_MIN_GAP:g})")
    p.add_argument("--out", type=Path, help="write the topology here (YAML, for raypd serve --topology)")
    p.add_argument("--json", type=Path, help="write every pair's figures, the racks and the machines here")
    return p


def options_from(args: argparse.Namespace) -> Options:
    if not 0 < args.block_bytes <= args.bytes // 2 or args.bytes > MAX_POOL_BYTES:
        raise ValueError("--block-bytes must be at most half of --bytes, and --bytes at most 4GiB")
    if not (1 <= args.reps <= 1000 and 0 <= args.warmup <= 100 and args.timeout > 0 and args.min_gap > 1):
        raise ValueError("--reps 1-1000, --warmup 0-100, --timeout > 0 and --min-gap > 1")
    blocks = math.ceil(args.bytes / args.block_bytes)
    spec = ProbeSpec(args.backend, args.block_bytes, blocks, args.timeout, args.nixl_backend, args.nixl_devices)
    return Options(spec, WritePlan(args.warmup, args.reps, args.block_bytes, blocks), same_host=not args.no_same_host,
                   one_way=args.one_way, start_timeout_s=args.start_timeout)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = shlex.join(["raypd", "bench", "links", *(argv if argv is not None else sys.argv[1:])])
    try:
        options = options_from(args)
        from raypd.kvtransfer.data_plane_auth import data_plane_secret_from_env
        secret = data_plane_secret_from_env()
    except ValueError as e:
        print(f"raypd bench links: {e}", file=sys.stderr)
        return 2
    address = args.address or os.environ.get(RAY_ADDRESS_VARIABLE) or "auto"
    try:
        ray_init = init_ray(address, 0)
    except (ConnectionError, RuntimeError, ValueError) as e:
        print(f"raypd bench links: no Ray cluster at {address!r} ({reason(e)}); start one (ray up, ray start) "
              "or pass --address HEAD:6379", file=sys.stderr)
        return 2
    before = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        started = time.time()
        m = measure(options, secret)
        elapsed = time.time() - started
    except (KeyboardInterrupt, Terminated):
        print("raypd bench links: interrupted; the probes were stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, before)
        if ray_init.context is not None:
            import ray
            ray.shutdown()
    hosts = [Host(h["ip"], h["node_id"], h["hostname"], h.get("tor_label")) for h in m.hosts]
    links = undirected(m.pairs)
    racks = group(hosts, links, args.min_gap)
    same = m.same_host.figure if m.same_host else None
    topology = topology_spec(links, racks, same)
    config = {**{k: v for k, v in vars(args).items() if k not in ("out", "json")}, "blocks": options.plan.blocks,
              "elapsed_s": elapsed, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started))}
    machine = {"driver": {"platform": platform.platform(), "cpus": os.cpu_count(), "loadavg": os.getloadavg(),
                          "python": platform.python_version(), "ray": _version("ray"), "nixl": _version("nixl")}}
    report = build_report(m, links, racks, topology, config, command, machine)
    print(table(m, racks))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(to_yaml(topology, [f"measured by: {command}", f"on {config['date']}; "
                                               "use with: raypd serve --topology THIS_FILE"]))
        print(f"wrote {args.out}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str))
        print(f"wrote {args.json}")
    failed = m.unstarted or any(not r.ok for r in m.pairs + ([m.same_host] if m.same_host else []))
    return 1 if failed else 0


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
