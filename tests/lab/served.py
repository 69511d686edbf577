"""`raypd serve --place-by-role` on a lab (a head host, prefill hosts, decode hosts), for the lab's
serve tests: Ray started on every host with UCX restricted to the network, the server on the head
host, which host each raypd actor runs on, and the nodes' state read from inside the head host."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

from raypd.benchmarks.lab.hosts import Host, Lab
from raypd.benchmarks.lab.ray_hosts import NETWORK_ONLY, LabRay, start_ray

PORT = 8000
READY = "ready; Ctrl-C stops everything"
# Actor process titles (Ray's setproctitle) -> what they are.
TITLES = {"ray::ServeReplica:raypd:OpenAIIngress": "ingress", "ray::ServeReplica:raypd:NodePool": "pool",
          "ray::Conductor": "conductor", "ray::PrefillNode": "prefill", "ray::DecodeNode": "decode"}


# Ray's GCS health check of each raylet every second instead of every 3 s (same timeout per check and
# same 5 failures in a row): a host whose processes are all killed is declared dead, and its node
# actor restarted elsewhere, ~5 s after instead of ~15 s. A live raylet still answers each check.
FAST_HOST_LOSS = {"RAY_health_check_period_ms": "1000"}


def serve_on_lab(lab: Lab, model: str, log_path: Path) -> tuple[LabRay, subprocess.Popen]:
    """Ray on every host (host 1 prefill, the rest decode; a lost host seen within ~5 s), then `raypd
    serve` on host 0 with one prefill and len(hosts) - 2 decode nodes of `model`; returns once ready."""
    head, prefill_host, *decode_hosts = lab.hosts
    lab_ray = start_ray(lab, {prefill_host.index: "prefill", **{h.index: "decode" for h in decode_hosts}},
                        cpus_per_host=2, extra_env={**NETWORK_ONLY, **FAST_HOST_LOSS})
    return lab_ray, serve(lab, lab_ray, model, log_path, prefill_nodes=1, decode_nodes=len(decode_hosts))


def serve(lab: Lab, lab_ray: LabRay, model: str, log_path: Path, prefill_nodes: int, decode_nodes: int,
          extra_args: Sequence[str] = ()) -> subprocess.Popen:
    """`raypd serve --place-by-role` on host 0 of the lab's running Ray, with that many nodes of
    `model`; returns once it is ready. SIGINT stops it (it removes its app and nodes, not Ray)."""
    head = lab.hosts[0]
    with open(log_path, "w") as log:
        server = lab.popen(head, [sys.executable, "-m", "raypd", "serve", "--address", lab_ray.address,
                                  "--place-by-role", "--prefill-nodes", str(prefill_nodes), "--decode-nodes",
                                  str(decode_nodes), "--cpus-per-node", "1", "--model", model, "--kv-cache-memory",
                                  "64", "--host", head.ip, "--port", str(PORT), "--no-dashboard", *extra_args],
                           env=lab_ray.driver_env(), stdout=log, stderr=subprocess.STDOUT)
    wait_for(log_path, server, READY, timeout_s=300)
    return server


def url(head: Host) -> str:
    return f"http://{head.ip}:{PORT}"


def wait_for(log_path: Path, proc: subprocess.Popen, line: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while line not in log_path.read_text(errors="replace"):
        assert proc.poll() is None, f"exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"not ready within {timeout_s:.0f} s:\n{log_path.read_text()[-3000:]}"
        time.sleep(0.5)


def actors_by_host(lab: Lab) -> dict[str, set[str]]:
    """Which host each raypd actor's process runs in now, by the host's address."""
    where: dict[str, set[str]] = {}
    for host in lab.hosts:
        for title in lab.titles(host):
            for prefix, what in TITLES.items():
                if title.startswith(prefix):
                    where.setdefault(what, set()).add(host.ip)
    return where


# From inside the head host (this process cannot reach the lab's addresses): /health/ready and
# /admin/nodes read by the chaos benchmark's parsers, and each node's transport report (None for a
# node without a transfer endpoint: a mixed one; network None where the report is off).
NODE_STATE = textwrap.dedent("""
    import json, sys, urllib.error, urllib.request
    from raypd.benchmarks.chaos.health import parse_ready
    from raypd.benchmarks.chaos.held_blocks import sum_held
    def get(path):
        try:
            with urllib.request.urlopen(sys.argv[1] + path, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())
    ready = parse_ready(*get("/health/ready"))
    nodes = get("/admin/nodes")[1]
    held = sum_held(nodes)
    listed = nodes.get("nodes") if isinstance(nodes, dict) else None
    transports = {n["name"]: (n.get("transfer") or {}).get("transports") for n in listed or []
                  if isinstance(n, dict) and "name" in n}
    decoding = {n["pid"]: n["load"]["running"] + n["load"]["inflight"] for n in listed or []
                if isinstance(n, dict) and n.get("role") == "decode" and "load" in n}
    print(json.dumps({"live": sorted(n for n, m in ready.nodes.items() if m.state == "live"),
                      "held": held.total, "idle": held.idle, "errors": held.errors,
                      "blocks_in_use": held.blocks_in_use, "transports": transports, "decoding": decoding}))
""")


def node_state(lab: Lab, head: Host) -> dict:
    """The nodes' state as NODE_STATE prints it ({"error": ...} if it could not be read)."""
    done = lab.run(head, [sys.executable, "-c", NODE_STATE, url(head)], timeout_s=60, check=False)
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": done.stderr[-500:]}


def busiest_decode_host(lab: Lab, head: Host, hosts: Sequence[Host]) -> Host:
    """Of `hosts`, the one whose decode node holds the most requests now (decoding or waiting for
    their KV): the Conductor routes by prefix cache and load, so which host the streams are on is
    its choice, not the test's (after a fault's replays every prompt may be cached on one node)."""
    decoding = {int(pid): n for pid, n in node_state(lab, head).get("decoding", {}).items()}
    pids = {h.ip: set(lab.pids_in(h.namespace)) for h in hosts}
    held = {h.ip: sum(n for pid, n in decoding.items() if pid in pids[h.ip]) for h in hosts}
    busiest = max(hosts, key=lambda h: held[h.ip])
    assert held[busiest.ip] > 0, f"no decode host holds a request: {decoding}"
    return busiest


def wait_live_and_idle(lab: Lab, head: Host, nodes: int, timeout_s: float) -> dict:
    """Poll until `nodes` nodes are live and every node answers idle (bounded); the last state."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = node_state(lab, head)
        if len(state.get("live", [])) == nodes and state.get("idle") or time.monotonic() > deadline:
            return state
        time.sleep(1.0)
