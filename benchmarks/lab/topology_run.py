"""Does a measured topology keep KV in the rack? (issue 32, must-hold 2): on a lab of two racks, the
same `raypd bench serve` workload of long prompts against `raypd serve --policy cost`, once without and
once with the topology `raypd bench links` measured, and per request whether the Conductor put its
prefill and decode nodes in one rack and how long its KV write took.

    python -m raypd.benchmarks.lab.topology_run --out-dir DIR [--max-concurrency 2,4]   (root)

Each --max-concurrency value is one pair of runs (without, then with the file), on one lab and one
Ray cluster; Serve is shut down between runs. DIR gets topology_run.json, the topology, the links
report, and each run's server log and bench serve JSON.

The lab (benchmarks/lab/hosts.py): rack0 holds the head (host 0), a prefill host (1) and a decode host
(2); rack1 a prefill host (3) and a decode host (4); the racks are joined by a `tc tbf` link of
--cross-rack-rate. Ray runs on every host with its role and rack labels and UCX_TLS=tcp,self (no
same-machine shortcut between namespaces: tests/lab/served.py). Without --topology the Conductor
builds its topology from the rack labels with default link speeds, which give a cross-rack pair the
same bandwidth as an in-rack one; with the measured file, a cross-rack write costs ~70x more.

Per request (joined by request id): the Conductor's decision (recent_decisions: prefill and decode
node, its estimates) and the prefill node's KV write time, posted -> landed (stats()["kv_writes"],
prefill_node/kv_write_log.py); each node's host from Ray. TTFT comes from bench serve's JSON.
Everything runs inside lab hosts (this process cannot reach the lab's addresses); every wait has a
timeout; the servers and the lab are stopped on every exit path (Lab.close kills what remains).
"""
from __future__ import annotations

import argparse
import json
import math
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from raypd.benchmarks.lab.ray_hosts import NETWORK_ONLY, PD_RACKS, PD_ROLES

PORT = 8000
READY = "ready; Ctrl-C stops everything"
SERVE_READY_S = 420.0
STOP_S = 60.0
EXPLAINED = 4   # decisions explained in full per run (the first ones)

SERVE_SHUTDOWN = "import sys, ray; from ray import serve; ray.init(address=sys.argv[1]); serve.shutdown()"
# Run inside the head host after the workload: the Conductor's decisions, each node's host (IP) and
# each prefill node's recent KV write times, as one JSON line.
COLLECT = textwrap.dedent("""
    import json, sys, ray
    from raypd.conductor.actor import DEFAULT_NAME
    ray.init(address=sys.argv[1], log_to_driver=False)
    named = ray.util.list_named_actors(all_namespaces=True)
    where = {a["name"]: a["namespace"] for a in named}
    conductor = ray.get_actor(DEFAULT_NAME, namespace=where[DEFAULT_NAME])
    st = ray.get(conductor.status.remote(), timeout=60)
    decisions = ray.get(conductor.recent_decisions.remote(int(sys.argv[2])), timeout=60)
    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    nodes, kv = {}, {}
    for name, n in st["nodes"].items():
        nodes[name] = {"role": str(n["role"]), "ip": ips.get(n.get("node_id"), "")}
        if name in where and "prefill" in str(n["role"]):
            stats = ray.get(ray.get_actor(name, namespace=where[name]).stats.remote(), timeout=60)
            kv[name] = stats.get("kv_writes") or {}
    print(json.dumps({"nodes": nodes, "kv_writes": kv, "decisions": [d.to_dict() for d in decisions],
                      "explain": [d.explain() for d in decisions[:int(sys.argv[3])]]}, default=str))
""")


# -- pure: per request rows and their summary ----------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between closest ranks; None when empty."""
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def request_rows(collected: Mapping[str, Any], rack_of_ip: Mapping[str, int]) -> list[dict[str, Any]]:
    """One row per decided request of the split path: its prefill and decode node, their racks, whether
    they share one, the Conductor's estimated send time and the measured KV write time (None when the
    prefill node reported none for it)."""
    nodes = collected["nodes"]
    writes = {rid: s for log in collected["kv_writes"].values() for rid, s in log.get("recent", [])}
    rows = []
    for d in collected["decisions"]:
        if d.get("rejected") or d.get("path", "split") != "split":
            continue
        p_ip, d_ip = nodes.get(d["prefill_node"], {}).get("ip"), nodes.get(d["decode_node"], {}).get("ip")
        p_rack, d_rack = rack_of_ip.get(p_ip or ""), rack_of_ip.get(d_ip or "")
        chosen = next((c for c in d.get("candidates", []) if c["node"] == d["prefill_node"]), None)
        rows.append({"request_id": d["request_id"], "prefill": d["prefill_node"], "decode": d["decode_node"],
                     "prefill_rack": p_rack, "decode_rack": d_rack,
                     "in_rack": p_rack is not None and p_rack == d_rack,
                     "est_send_s": chosen["send_s"] if chosen else None, "est_ttft_s": d.get("est_ttft_s"),
                     "prompt_tokens": d.get("prompt_tokens"), "kv_write_s": writes.get(d["request_id"])})
    return rows


def summarize(rows: Sequence[Mapping[str, Any]], serve_report: Mapping[str, Any] | None) -> dict[str, Any]:
    """Share of requests kept in the rack; KV write time p50/p99 (all, in rack, across racks); TTFT
    p50/p99 from bench serve's report (its one step)."""
    def stats(values: list[float]) -> dict[str, Any]:
        return {"n": len(values), "p50_s": percentile(values, 50), "p99_s": percentile(values, 99),
                "max_s": max(values) if values else None}
    kv = [r["kv_write_s"] for r in rows if r["kv_write_s"] is not None]
    out: dict[str, Any] = {
        "requests": len(rows), "in_rack": sum(r["in_rack"] for r in rows),
        "in_rack_share": sum(r["in_rack"] for r in rows) / len(rows) if rows else None,
        "pairs": _count(f"{r['prefill']}->{r['decode']}" for r in rows),
        "kv_write": stats(kv),
        "kv_write_in_rack": stats([r["kv_write_s"] for r in rows if r["in_rack"] and r["kv_write_s"] is not None]),
        "kv_write_across": stats([r["kv_write_s"] for r in rows if not r["in_rack"] and r["kv_write_s"] is not None]),
    }
    step = _serve_step(serve_report)
    if step is not None:
        out |= {"completed": step.get("completed"), "ttft_p50_s": step.get("ttft_p50_s"),
                "ttft_p99_s": step.get("ttft_p99_s"), "e2e_p50_s": step.get("e2e_p50_s")}
    return out


def _count(keys) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in keys:
        out[k] = out.get(k, 0) + 1
    return dict(sorted(out.items()))


def _serve_step(report: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The (only) system's reported step in a `raypd bench serve --json` report (report.system_entry:
    the step's figures at the entry's top level)."""
    if not report:
        return None
    return next(iter((report.get("systems") or {}).values()), None)


# -- the lab run --------------------------------------------------------------------------------------
def _wait_for(log_path: Path, proc: subprocess.Popen, line: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while line not in log_path.read_text(errors="replace"):
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"not ready within {timeout_s:.0f} s:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.5)


def _stop(proc: subprocess.Popen) -> int | None:
    """SIGINT, then SIGKILL after STOP_S; the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


def run_one(lab, lab_ray, label: str, topology: Path | None, args: argparse.Namespace, out_dir: Path,
            rack_of_ip: Mapping[str, int], concurrency: int) -> dict[str, Any]:
    """One `raypd serve`, the workload, the decisions; then SIGINT, and Serve shut down: a server that
    joined a cluster deletes only its app when it stops, and Serve's HTTP proxy would keep the port
    (the next server, on another port, would print an endpoint the proxy does not serve)."""
    head = lab.hosts[0]
    serve = ["raypd", "serve", "--address", lab_ray.address, "--place-by-role", "--prefill-nodes", "2",
             "--decode-nodes", "2", "--policy", "cost", "--cpus-per-node", f"{args.cpus_per_node:g}",
             "--kv-cache-memory", str(args.kv_cache_memory), "--host", head.ip, "--port", str(PORT),
             "--no-dashboard", *(["--topology", str(topology)] if topology else [])]
    report_path = out_dir / f"serve_{label}.json"
    bench = ["raypd", "bench", "serve", "--base-url", f"http://{head.ip}:{PORT}/v1", "--label", label,
             "--dataset", "random", "--random-input-len", str(args.input_len), "--random-output-len",
             str(args.output_len), "--random-range-ratio", "0", "--num-prompts", str(args.num_prompts),
             "--max-concurrency", str(concurrency), "--request-timeout", "300", "--seed", "0",
             "--json", str(report_path)]
    log_path = out_dir / f"serve_{label}.log"
    started = time.time()
    with open(log_path, "w") as log:
        server = lab.popen(head, [sys.executable, "-m", *serve], env=lab_ray.driver_env(), stdout=log,
                           stderr=subprocess.STDOUT)
    try:
        _wait_for(log_path, server, READY, SERVE_READY_S)
        ready_s = time.time() - started
        done = lab.run(head, [sys.executable, "-m", *bench], env=lab_ray.driver_env(), timeout_s=args.bench_timeout,
                       check=False)
        (out_dir / f"bench_{label}.txt").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr[-5000:])
        got = lab.run(head, [sys.executable, "-c", COLLECT, lab_ray.address, "1000", str(EXPLAINED)],
                      env=lab_ray.driver_env(), timeout_s=180, check=False)
        collected = json.loads(got.stdout.strip().splitlines()[-1]) if got.returncode == 0 else None
        if collected is None:
            raise RuntimeError(f"collecting the decisions failed ({got.returncode}): {got.stderr[-2000:]}")
    finally:
        stopped = _stop(server)
        lab.run(head, [sys.executable, "-c", SERVE_SHUTDOWN, lab_ray.address], env=lab_ray.driver_env(),
                timeout_s=120, check=False)
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    rows = request_rows(collected, rack_of_ip)
    return {"label": label, "max_concurrency": concurrency, "topology": str(topology) if topology else None,
            "commands": {"serve": shlex.join(serve), "bench": shlex.join(bench)},
            "bench_rc": done.returncode, "server_exit": stopped, "ready_s": ready_s,
            "elapsed_s": time.time() - started, "summary": summarize(rows, report),
            "nodes": collected["nodes"], "requests": rows, "explain": collected["explain"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m raypd.benchmarks.lab.topology_run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", type=Path, required=True)
    p.add_argument("--cross-rack-rate", default="200mbit")
    p.add_argument("--links-bytes", default="8MiB", help="bench links --bytes (default 8MiB)")
    p.add_argument("--input-len", type=int, default=1500)
    p.add_argument("--output-len", type=int, default=8)
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-concurrency", default="2", help="comma-separated: each value is one pair of runs")
    p.add_argument("--cpus-per-node", type=float, default=1.0)
    p.add_argument("--kv-cache-memory", type=int, default=512, metavar="MB")
    p.add_argument("--bench-timeout", type=float, default=900.0)
    args = p.parse_args(argv)
    from raypd.benchmarks.lab.hosts import Lab, LabSpec
    from raypd.benchmarks.lab.ray_hosts import start_ray

    out_dir = args.out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"command": shlex.join(["python", "-m", "raypd.benchmarks.lab.topology_run",
                                                     *(argv if argv is not None else sys.argv[1:])]),
                              "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "config": {
                                  k: str(v) for k, v in vars(args).items()}, "runs": {}}
    spec = LabSpec(hosts_per_rack=PD_RACKS, cross_rack_rate=args.cross_rack_rate)
    with Lab(spec) as lab:
        head = lab.hosts[0]
        rack_of_ip = {h.ip: h.rack for h in lab.hosts}
        result["hosts"] = [{"index": h.index, "rack": h.rack, "ip": h.ip, "role": PD_ROLES.get(h.index, "head")}
                           for h in lab.hosts]
        lab_ray = start_ray(lab, PD_ROLES, cpus_per_host=args.cpus_per_node, extra_env=NETWORK_ONLY)
        topo = out_dir / "topo.yaml"
        links = ["raypd", "bench", "links", "--address", lab_ray.address, "--bytes", args.links_bytes,
                 "--out", str(topo), "--json", str(out_dir / "links.json")]
        started = time.time()
        done = lab.run(head, [sys.executable, "-m", *links], env=lab_ray.driver_env(), timeout_s=900, check=False)
        result["links"] = {"command": shlex.join(links), "rc": done.returncode, "elapsed_s": time.time() - started,
                           "table": done.stdout[-3000:]}
        if not topo.exists():
            raise RuntimeError(f"bench links wrote no topology ({done.returncode}): {done.stderr[-2000:]}")
        result["topology"] = topo.read_text()
        for c in (int(v) for v in args.max_concurrency.split(",")):
            for name, topology in (("without_topology", None), ("with_topology", topo)):
                label = f"{name}_c{c}"
                result["runs"][label] = run_one(lab, lab_ray, label, topology, args, out_dir, rack_of_ip, c)
            (out_dir / "topology_run.json").write_text(json.dumps(result, indent=2, default=str))
    (out_dir / "topology_run.json").write_text(json.dumps(result, indent=2, default=str))
    for label, run in result["runs"].items():
        s = run["summary"]
        print(f"{label}: in rack {s['in_rack']}/{s['requests']}, kv write p50/p99 {s['kv_write']['p50_s']}/"
              f"{s['kv_write']['p99_s']} s, ttft p50/p99 {s.get('ttft_p50_s')}/{s.get('ttft_p99_s')} s")
    print(f"wrote {out_dir / 'topology_run.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
