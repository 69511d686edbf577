"""`raypd bench links` on a lab (benchmarks/lab) of two racks of two hosts, the racks joined at 50 mbit
while hosts in one rack share a bridge (issue 32, items 2 and 3). Ray runs on every host with UCX
limited to the network (benchmarks/lab/ray_hosts.py's NETWORK_ONLY: namespaces share one kernel, so UCX
would otherwise copy between them with CMA), and the benchmark runs inside the head host, joining
the cluster by its address, as an operator runs it after `ray up`. The topology file it writes,
read back by Topology.from_yaml, groups the hosts by their racks and gives every in-rack pair more
bandwidth than every cross-rack pair; with nixl, UCX's own tables say every write between two hosts
took tcp; the probes are gone when it exits. 50 mbit, not more: the tcp backend moves bytes through
Python, and on a busy 2-core CI machine an in-rack pair measured only 2.6x a 200 mbit link, below
the 3x gap that separates racks. Both backends: nixl both ways, tcp one way (cheaper).
A transfer path that cannot be set up (an RDMA device the hosts lack) makes every pair unreachable,
each with the reason, and an exit status of 1, not a crash. Small writes suffice: 1 MiB crosses
50 mbit in 170 ms, a bridge in a few."""
from __future__ import annotations

import itertools
import json
import sys
import time

import pytest

from raypd.benchmarks.lab.hosts import Lab, LabSpec, unavailable_reason
from raypd.benchmarks.lab.ray_hosts import NETWORK_ONLY, LabRay, start_ray
from raypd.conductor.topology import Topology

pytestmark = [pytest.mark.cluster,  # starts Ray and the benchmark inside namespaces
              pytest.mark.skipif(unavailable_reason() is not None, reason=f"no lab here: {unavailable_reason()}")]

SMALL_RUN = ["--bytes", "1MiB", "--reps", "3", "--warmup", "2", "--no-same-host", "--timeout", "60"]


@pytest.fixture(scope="module")
def lab_ray():
    lab = Lab(LabSpec(hosts_per_rack=(2, 2), cross_rack_rate="50mbit"))
    with lab:
        yield lab, start_ray(lab, {1: "prefill", 2: "decode", 3: "decode"}, cpus_per_host=1, extra_env=NETWORK_ONLY)
    assert (lab.namespaces(), lab.links(), lab.folder.exists()) == ([], [], False)


def bench_links(lab: Lab, ray: LabRay, name: str, flags: list[str]) -> tuple[int, str, dict, Topology]:
    """Run the benchmark inside the head host; (exit status, stdout, the JSON, the topology read back)."""
    out, report = lab.folder / f"{name}.yaml", lab.folder / f"{name}.json"
    done = lab.run(lab.hosts[0], [sys.executable, "-m", "raypd", "bench", "links", "--address", ray.address,
                                  "--out", str(out), "--json", str(report), *flags],
                   env=ray.driver_env(), timeout_s=400, check=False)
    assert report.exists() and out.exists(), done.stdout[-2000:] + done.stderr[-3000:]
    assert probes_gone(lab, timeout_s=30), [lab.titles(h) for h in lab.hosts]
    return done.returncode, done.stdout, json.loads(report.read_text()), Topology.from_yaml(out)


@pytest.mark.parametrize("backend, flags, pairs", [("nixl", [], 12), ("tcp", ["--one-way"], 6)])
def test_the_topology_groups_the_hosts_by_their_racks(lab_ray, backend, flags, pairs):
    lab, ray = lab_ray
    rc, stdout, report, topo = bench_links(lab, ray, backend, ["--backend", backend, *SMALL_RUN, *flags])
    failed = [line for line in stdout.splitlines() if "unreachable" in line or "no probe" in line]
    assert rc == 0, failed or stdout[-2000:]
    racks = {frozenset(h.ip for h in lab.hosts if h.rack == r) for r in (0, 1)}
    assert {frozenset(ips) for ips in report["racks"]["members"].values()} == racks, report["racks"]
    assert sorted(topo.hosts) == sorted(h.ip for h in lab.hosts) and report["labels_agree"] is True
    in_rack = [p for rack in racks for p in itertools.combinations(sorted(rack), 2)]
    across = [(a.ip, b.ip) for a, b in itertools.combinations(lab.hosts, 2) if a.rack != b.rack]
    slowest_in_rack = min(topo.bandwidth_gbps(a, b) for a, b in in_rack)
    fastest_across = max(topo.bandwidth_gbps(a, b) for a, b in across)
    assert slowest_in_rack > 2 * fastest_across, (slowest_in_rack, fastest_across)
    assert len(report["pairs"]) == pairs and all(p["ok"] for p in report["pairs"])
    if backend == "nixl":   # UCX's own tables: tcp between every two hosts, never CMA or shared memory
        transports = {t for p in report["pairs"] for t in p["transport"]["transports"]}
        assert {t.split("/")[0] for t in transports} == {"tcp"}, transports
        assert report["network_only"] is True


def test_a_pair_that_cannot_transfer_is_reported_unreachable(lab_ray):
    lab, ray = lab_ray
    rc, stdout, report, topo = bench_links(lab, ray, "no-device", ["--nixl-devices", "mlx5_9", "--one-way", *SMALL_RUN])
    assert rc == 1
    assert len(report["pairs"]) == 6 and not any(p["ok"] for p in report["pairs"])
    assert all(p["reason"].startswith("open the link: ") and "mlx5_9" in p["reason"] for p in report["pairs"])
    assert stdout.count("unreachable: open the link") == 12   # each pair's progress line and table row
    assert report["racks"]["members"] == {} and topo.hosts == []


def probes_gone(lab: Lab, timeout_s: float) -> bool:
    """No LinkProbe actor's process left in any host (their killed workers exit within moments)."""
    deadline = time.monotonic() + timeout_s
    while any(t.startswith("ray::LinkProbe") for h in lab.hosts for t in lab.titles(h)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True
