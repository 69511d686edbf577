"""What `raypd bench links` reports beside the figures (benchmarks/links/report.py): whether every write
between two hosts took a network transport (issue 32, item 2), whether the measured racks agree
with the raypd.io/tor labels, and a table that shows an unreachable pair's reason and the warning."""
from __future__ import annotations

from raypd.benchmarks.links.measure import Measurement
from raypd.benchmarks.links.pairs import PairResult
from raypd.benchmarks.links.racks import Racks
from raypd.benchmarks.links.report import labels_agree, network_only, table

A, B, C = "198.18.0.10", "198.18.0.11", "198.18.1.12"


def ok(src: str, dst: str, transport: str, network: bool | None) -> PairResult:
    return PairResult(src, dst, True, "", 4096, 1 << 20, (1e-4,), (1e-2,), 2e-4,
                      {"transports": [transport] if network is not None else [], "scope": "inter-node",
                       "network": network, "note": "UCX protocol table (UCX_PROTO_INFO)"})


def test_network_only_judges_writes_between_two_hosts():
    same_host_cma = ok(A, A, "cma/memory", False)
    assert network_only([ok(A, B, "tcp/eth0", True), ok(B, C, "rc_mlx5/mlx5_0:1", True), same_host_cma]) is True
    assert network_only([ok(A, B, "tcp/eth0", True), ok(B, C, "cma/memory", False)]) is False
    assert network_only([ok(A, B, "tcp/eth0", True), ok(B, C, "", None)]) is None
    assert network_only([PairResult(A, B, False, "write: no answer")]) is None


def test_labels_agree_only_when_every_host_has_one_and_they_group_alike():
    racks = Racks({"rack0": (A, B), "rack-1": (C,)}, 10.0, 1.0)
    hosts = [{"ip": A, "tor_label": "rack0"}, {"ip": B, "tor_label": "rack0"}, {"ip": C, "tor_label": "rack1"}]
    assert labels_agree(hosts, racks) is True
    hosts[1]["tor_label"] = "rack1"
    assert labels_agree(hosts, racks) is False
    hosts[1]["tor_label"] = None
    assert labels_agree(hosts, racks) is None


def test_the_table_shows_the_reason_of_an_unreachable_pair_and_warns_of_a_same_machine_transport():
    m = Measurement(pairs=[ok(A, B, "cma/memory", False), PairResult(A, C, False, "open the link: refused")],
                    unstarted={"198.18.1.13": "the probe did not start within 120 s"})
    text = table(m, Racks({"rack-0": (A, B)}, None, None))
    assert f"{A} -> {C}" in text and "unreachable: open the link: refused" in text
    assert "cma/memory (inter-node)" in text and "198.18.1.13: no probe (the probe did not start within 120 s)" in text
    assert "racks: one" in text and text.splitlines()[-1].startswith("WARNING: some writes between different hosts")
