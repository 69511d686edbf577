from __future__ import annotations

import pytest

from raypd.conductor.errors import TopologyError
from raypd.conductor.topology import LinkSpec, Topology, TopologyDefaults

DEFAULTS = TopologyDefaults(host_tor=LinkSpec(25.0, 2.0), tor_spine=LinkSpec(100.0, 1.0),
                            host_nvlink=LinkSpec(450.0, 1.0), same_host=LinkSpec(30.0, 0.0))

YAML = """
defaults:
  host_tor: {bandwidth: 25, latency_us: 2}
  tor_spine: {bandwidth: 100, latency_us: 1}
  host_nvlink: {bandwidth: 450, latency_us: 1}
  same_host: {bandwidth: 30, latency_us: 0}
switches:
  - {name: s0, kind: spine}
  - {name: s1, kind: spine}
  - {name: t0, kind: tor}
  - {name: t1, kind: tor}
  - {name: t2, kind: tor}
  - {name: t3, kind: tor}
  - {name: nvl0, kind: nvlink}
links:
  - {a: t0, b: s0, bandwidth: 100, latency_us: 1}
  - {a: t0, b: s1, bandwidth: 100, latency_us: 1}
  - {a: t1, b: s0, bandwidth: 100, latency_us: 1}
  - {a: t1, b: s1, bandwidth: 100, latency_us: 1}
  - {a: t2, b: s0, bandwidth: 100, latency_us: 1}
  - {a: t2, b: s1, bandwidth: 100, latency_us: 1}
  - {a: t3, b: s0, bandwidth: 10, latency_us: 1}
  - {a: t3, b: s1, bandwidth: 100, latency_us: 3}
hosts:
  - {name: h0, tor: t0, nvlink_domain: nvl0}
  - {name: h1, tor: t0, nvlink_domain: nvl0}
  - {name: h2, tor: t1}
  - {name: h3, tor: t1}
  - {name: h4, tor: t2}
  - {name: h5, tor: t2}
  - {name: h6, tor: t3}
  - {name: h7, attach: [{switch: t3, bandwidth: 5, latency_us: 4}]}
"""


@pytest.fixture
def topo() -> Topology:
    """2 spines, 4 ToRs, 8 hosts; h0/h1 share an NVLink domain; t3's uplink through s0 is narrow
    but short, through s1 wide but long; h7 has a slow NIC."""
    return Topology.from_yaml_text(YAML)


def test_distances_and_bandwidths_on_two_spine_four_tor(topo):
    d, b = topo.distance_us, topo.bandwidth_gbps
    assert (d("h0", "h0"), b("h0", "h0")) == (0.0, 30.0)            # same host
    assert (d("h0", "h1"), b("h0", "h1")) == (2.0, 450.0)           # NVLink beats the ToR (4 us)
    assert (d("h2", "h3"), b("h2", "h3")) == (4.0, 25.0)            # same ToR
    assert (d("h0", "h2"), b("h0", "h2")) == (6.0, 25.0)            # ToR -> spine -> ToR
    # lowest latency path to t3 goes through s0 (6 us) and is limited by its 10 GB/s uplink
    assert (d("h0", "h6"), b("h0", "h6")) == (6.0, 10.0)
    assert (d("h6", "h7"), b("h6", "h7")) == (6.0, 5.0)             # slow NIC is the bottleneck
    assert d("h2", "h0") == d("h0", "h2")
    assert topo.tor_of("h4") == "t2"
    # transfer time = bytes / bandwidth + latency
    assert topo.transfer_s("h0", "h2", 25e9) == pytest.approx(1.0 + 6e-6)


def test_dict_and_code_built_graphs_agree(topo):
    t = Topology(DEFAULTS)
    for s in ("s0", "s1"):
        t.add_switch(s, "spine")
    for i in range(4):
        t.add_switch(f"t{i}", "tor")
        t.add_link(f"t{i}", "s0", 10.0 if i == 3 else 100.0, 1.0)
        t.add_link(f"t{i}", "s1", 100.0, 3.0 if i == 3 else 1.0)
    t.add_host("h0", tor="t0", nvlink_domain="nvl0")
    t.add_host("h1", tor="t0", nvlink_domain="nvl0")
    for i, tor in enumerate(["t1", "t1", "t2", "t2", "t3"], start=2):
        t.add_host(f"h{i}", tor=tor)
    t.add_host("h7", {"t3": LinkSpec(5.0, 4.0)})
    for a in topo.hosts:
        for b in topo.hosts:
            assert t.distance_us(a, b) == topo.distance_us(a, b), (a, b)
            assert t.bandwidth_gbps(a, b) == topo.bandwidth_gbps(a, b), (a, b)


def test_join_and_leave_refresh_the_matrices(topo):
    before = topo.num_rebuilds
    topo.add_host("h8", tor="t2")
    assert topo.num_rebuilds == before + 1
    assert topo.distance_us("h8", "h4") == 4.0 and topo.distance_us("h8", "h0") == 6.0
    topo.remove_host("h8")
    with pytest.raises(TopologyError):
        topo.distance_us("h8", "h4")
    # the freed index is reused by the next host
    assert topo.add_host("h9", tor="t0") == 8


def test_from_ray_labels_and_defaults():
    labels = {
        "n1": {"raypd.io/tor": "tor-a", "raypd.io/spine": "sp"},
        "n2": {"raypd.io/tor": "tor-a"},
        "n3": {"raypd.io/tor": "tor-b", "raypd.io/spine": "sp"},
        "n4": {},
    }
    t = Topology.from_ray_labels(labels, DEFAULTS)
    assert t.distance_us("n1", "n2") == 4.0
    assert t.distance_us("n1", "n3") == 6.0             # tor-a -> sp -> tor-b
    assert t.tor_of("n4") == "tor-default"
    # n4's default ToR hangs off the default spine; islands are joined through a core switch
    assert t.distance_us("n4", "n2") == 2 + 1 + 1 + 1 + 1 + 2
    assert t.bandwidth_gbps("n4", "n2") == 25.0


def test_single_machine_and_unknown_host():
    t = Topology.single_machine("box")
    assert t.distance_us("box", "box") == 0.0
    assert t.bandwidth_gbps("box", "box") == t.defaults.same_host.bandwidth
    idx = t.ensure_host("other")
    assert idx == t.host_index("other") and t.distance_us("box", "other") > 0


def test_bad_specs_are_rejected():
    with pytest.raises(TopologyError):
        Topology.from_dict({"links": [{"a": "x", "b": "y", "bandwidth": 1}]})
    with pytest.raises(TopologyError):
        Topology.from_dict({"defaults": {"warp": {"bandwidth": 1}}})
    t = Topology()
    t.add_switch("a")
    t.add_switch("b")
    with pytest.raises(TopologyError):
        t.add_link("a", "b", 0.0, 1.0)
