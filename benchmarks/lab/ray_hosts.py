"""A Ray cluster across a lab's hosts, as an operator starts one on real machines: `ray start --head`
on host 0, `ray start --address` on each other host, every node with its own IP (--node-ip-address),
its role and rack as labels (raypd.io/role, raypd.io/tor, as cluster/cluster.yaml gives them) and a
temporary folder of its own (Lab.host_folder: hosts share this machine's file system).

Unlike ray.cluster_utils.Cluster, whose raylets all share one IP, each raylet here is reachable
only at its host's address. Stopping is the lab's: close() kills every process in the namespaces.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from raypd.benchmarks.lab.hosts import Host, Lab, LabError
from raypd.cluster.launch.placement import ROLE_LABEL
from raypd.conductor.topology import TOR_LABEL

GCS_PORT = 6379
START_TIMEOUT_S = 120.0
# UCX restricted to the network: the namespaces share one kernel, so without it UCX would move KV by
# CMA or shared memory between "hosts", the same-machine shortcut no two real hosts have.
NETWORK_ONLY = {"UCX_TLS": "tcp,self"}
# The lab of issue 32's must-hold 1: rack 0 = head host 0, prefill host 1, decode host 2; rack 1 =
# prefill host 3, decode host 4 (Lab's hosts_per_rack, and host index -> raypd.io/role).
PD_RACKS = (3, 2)
PD_ROLES = {1: "prefill", 2: "decode", 3: "prefill", 4: "decode"}


@dataclass(frozen=True, slots=True)
class LabRay:
    address: str                 # HEAD_IP:6379, for `--address` and RAY_ADDRESS
    env: dict[str, str]          # the environment every lab process runs with

    def driver_env(self) -> dict[str, str]:
        return {**self.env, "RAY_ADDRESS": self.address}


def lab_env() -> dict[str, str]:
    """Ray without token auth (the lab's hosts share no secret file) and without usage reporting."""
    return {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def start_ray(lab: Lab, roles: Mapping[int, str], cpus_per_host: float = 1.0,
              extra_env: Mapping[str, str] | None = None) -> LabRay:
    """Start Ray's head on host 0 and a node on every other host; `roles` maps a host index to its
    raypd.io/role label (host 0 defaults to `head`); `extra_env` is set for every raylet, so every
    worker and actor inherits it (UCX_TLS, say). Returns once every node has joined."""
    ray_cli = str(Path(sys.executable).with_name("ray"))
    env = {**lab_env(), **(extra_env or {})}
    head = lab.hosts[0]
    address = f"{head.ip}:{GCS_PORT}"

    def ray_start(host: Host) -> subprocess.Popen:
        labels = f"{ROLE_LABEL}={roles.get(host.index, 'head' if host.index == 0 else 'none')},{TOR_LABEL}=rack{host.rack}"
        where = ["--head", "--port", str(GCS_PORT), "--include-dashboard=false"] if host is head else \
            ["--address", address]
        return lab.popen(host, [ray_cli, "start", *where, "--node-ip-address", host.ip, "--num-cpus",
                                f"{cpus_per_host:g}", "--labels", labels, "--temp-dir", str(lab.host_folder(host)),
                                "--disable-usage-stats"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)

    # The head first; then every other host at once (each `ray start` takes seconds).
    _finish(head, ray_start(head))
    for host, proc in [(h, ray_start(h)) for h in lab.hosts[1:]]:
        _finish(host, proc)
    lab_ray = LabRay(address, env)
    wait_for_nodes(lab, lab_ray, len(lab.hosts))
    return lab_ray


def _finish(host: Host, proc: subprocess.Popen) -> None:
    try:
        _, err = proc.communicate(timeout=START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise LabError(f"ray start on {host.namespace} did not finish within {START_TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
        raise LabError(f"ray start on {host.namespace} failed ({proc.returncode}): {err.strip()[-800:]}")


def wait_for_nodes(lab: Lab, lab_ray: LabRay, count: int, timeout_s: float = START_TIMEOUT_S) -> None:
    """Until `count` Ray nodes are alive, asked from host 0 (`ray status` would need the dashboard)."""
    probe = "import ray; ray.init(); print(sum(n['Alive'] for n in ray.nodes()))"
    deadline = time.monotonic() + timeout_s
    alive = ""
    while time.monotonic() < deadline:
        done = lab.run(lab.hosts[0], [sys.executable, "-c", probe], env=lab_ray.driver_env(), timeout_s=60, check=False)
        alive = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr.strip()[-300:]
        if alive == str(count):
            return
        time.sleep(1.0)
    raise LabError(f"{count} Ray nodes not alive within {timeout_s:.0f} s: {alive}")


def host_of(lab: Lab, ip: str) -> Host:
    return next(h for h in lab.hosts if h.ip == ip)
