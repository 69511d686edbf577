"""From measured pairs to the topology file (benchmarks/links: pairs.py, racks.py, topology_file.py), on
hand-built measurements: the line through each pair's two writes, the slower direction of a link,
racks found by the largest step down in bandwidth (labels only name them), and a file that
Topology.from_yaml reads back with the measured figures between every two hosts."""
from __future__ import annotations

import pytest

from raypd.benchmarks.links.pairs import Host, LinkFigure, PairResult, WritePlan, undirected
from raypd.benchmarks.links.racks import group, largest_gap
from raypd.benchmarks.links.topology_file import to_yaml, topology_spec
from raypd.conductor.topology import Topology

SMALL, BIG = 4 << 10, 32 << 20
A, B, C, D, E = "198.18.0.10", "198.18.0.11", "198.18.1.12", "198.18.1.13", "198.18.2.14"


def pair(src: str, dst: str, gbps: float, latency_us: float) -> PairResult:
    """A pair whose small writes took latency_us (the median; noise around it) and whose fastest big
    write moved gbps (the others slower)."""
    small, big = latency_us * 1e-6, BIG / (gbps * 1e9)
    return PairResult(src, dst, True, "", SMALL, BIG, (small, small * 3, small * 0.9), (big * 2, big, big * 1.1),
                      small, {"transports": ["tcp/eth0"], "scope": "inter-node", "network": True, "note": ""})


def both_ways(a: str, b: str, gbps: float, latency_us: float) -> list[PairResult]:
    return [pair(a, b, gbps, latency_us), pair(b, a, gbps, latency_us)]


def two_racks(in_rack: tuple[float, float] = (1.0, 100.0), across: tuple[float, float] = (0.1, 1000.0)) -> list[PairResult]:
    """A, B in one rack, C, D in another."""
    out = both_ways(A, B, *in_rack) + both_ways(C, D, *in_rack)
    for x in (A, B):
        for y in (C, D):
            out += both_ways(x, y, *across)
    return out


def hosts(*ips: str, labels: dict[str, str] | None = None) -> list[Host]:
    return [Host(ip, f"node-{ip}", f"host-{ip}", (labels or {}).get(ip)) for ip in ips]


def load(tmp_path, spec: dict) -> Topology:
    path = tmp_path / "topology.yaml"
    path.write_text(to_yaml(spec, ["measured by: raypd bench links", "use with: raypd serve --topology"]))
    return Topology.from_yaml(path)


def test_the_figures_are_the_fastest_big_write_and_the_median_small_write():
    f = pair(A, B, 2.5, 40.0).figure
    assert f is not None and f.gbps == pytest.approx(2.5) and f.latency_us == pytest.approx(40.0)
    assert PairResult(A, B, False, "write: no answer").figure is None


def test_the_write_plan_is_warmup_then_small_then_big():
    assert WritePlan(warmup=2, reps=3, block_bytes=SMALL, blocks=512).block_counts() == [1, 1, 1, 1, 1, 512, 512, 512]
    with pytest.raises(ValueError, match="reps >= 1"):
        WritePlan(warmup=0, reps=0, block_bytes=SMALL, blocks=512)


def test_a_link_takes_the_slower_direction_and_skips_failures_and_the_same_host():
    links = undirected([pair(A, B, 1.0, 100.0), pair(B, A, 0.5, 50.0), pair(A, A, 9.0, 1.0),
                        PairResult(A, C, False, "open the link: refused"), pair(C, A, 0.2, 300.0)])
    assert set(links) == {frozenset((A, B)), frozenset((A, C))}
    assert links[frozenset((A, B))].gbps == pytest.approx(0.5)
    assert links[frozenset((A, B))].latency_us == pytest.approx(100.0)
    assert links[frozenset((A, C))].gbps == pytest.approx(0.2)   # the one direction that was measured


def test_two_racks_are_told_apart_by_the_step_down_between_them():
    racks = group(hosts(A, B, C, D), undirected(two_racks()))
    assert racks.members == {"rack-0": (A, B), "rack-1": (C, D)}
    assert racks.gap == pytest.approx(10.0) and racks.near_gbps == pytest.approx(1.0)
    assert racks.rack_of(C) == "rack-1"


def test_noise_inside_a_rack_does_not_split_it():
    results = two_racks()
    results += both_ways(A, E, 0.5, 200.0) + both_ways(B, E, 0.45, 150.0)   # a third host of rack 0, 2x slower
    for x in (C, D):
        results += both_ways(E, x, 0.09, 1100.0)
    racks = group(hosts(A, B, C, D, E), undirected(results))
    assert racks.members == {"rack-0": (A, B, E), "rack-1": (C, D)}


def test_a_flat_network_is_one_rack():
    results = two_racks(in_rack=(1.0, 100.0), across=(0.6, 150.0))   # a step of 1.7x < the default 3
    assert group(hosts(A, B, C, D), undirected(results)).members == {"rack-0": (A, B, C, D)}
    assert group(hosts(A, B, C, D), undirected(results), min_gap=1.5).members == {"rack-0": (A, B), "rack-1": (C, D)}
    assert largest_gap([1.0]) is None and largest_gap([4.0, 1.0, 3.0]) == (3.0, 3.0)


def test_labels_name_the_racks_they_agree_with_and_never_group():
    labels = {A: "tor-a", B: "tor-a", C: "tor-b", D: "tor-x"}   # D's label disagrees with the measurement
    racks = group(hosts(A, B, C, D, labels=labels), undirected(two_racks()))
    assert racks.members == {"tor-a": (A, B), "rack-1": (C, D)}
    same = {A: "tor-a", B: "tor-a", C: "tor-a", D: "tor-a"}     # one label over two measured racks names neither
    assert list(group(hosts(A, B, C, D, labels=same), undirected(two_racks())).members) == ["rack-0", "rack-1"]


def test_the_file_reads_back_with_the_measured_figures(tmp_path):
    links = undirected(two_racks())
    racks = group(hosts(A, B, C, D), links)
    topo = load(tmp_path, topology_spec(links, racks, same_host=LinkFigure(6.5, 3.0)))
    assert sorted(topo.hosts) == [A, B, C, D]
    assert (topo.tor_of(A), topo.tor_of(B), topo.tor_of(C), topo.tor_of(D)) == ("rack-0", "rack-0", "rack-1", "rack-1")
    for x, y in ((A, B), (C, D)):
        assert topo.bandwidth_gbps(x, y) == pytest.approx(1.0) and topo.distance_us(x, y) == pytest.approx(100.0)
    for x in (A, B):
        for y in (C, D):
            assert topo.bandwidth_gbps(x, y) == pytest.approx(0.1) and topo.distance_us(x, y) == pytest.approx(1000.0)
            assert topo.bandwidth_gbps(x, y) < topo.bandwidth_gbps(A, B)
    assert topo.bandwidth_gbps(A, A) == 6.5 and topo.distance_us(A, A) == 3.0
    assert (topo.defaults.host_tor.bandwidth, topo.defaults.tor_spine.bandwidth) == (1.0, 0.1)


def test_three_racks_keep_each_pair_of_racks_own_figure(tmp_path):
    results = both_ways(A, B, 1.0, 100.0) + both_ways(C, D, 1.0, 100.0)
    results += [r for x in (A, B) for y in (C, D) for r in both_ways(x, y, 0.1, 1000.0)]
    results += [r for x in (A, B) for r in both_ways(x, E, 0.05, 2000.0)]
    results += [r for x in (C, D) for r in both_ways(x, E, 0.025, 2500.0)]
    links = undirected(results)
    racks = group(hosts(A, B, C, D, E), links)
    assert racks.members == {"rack-0": (A, B), "rack-1": (C, D), "rack-2": (E,)}
    topo = load(tmp_path, topology_spec(links, racks))
    # E, alone in its rack, gets its fastest link as its uplink: it narrows no path more than measured
    for x, y, gbps, us in ((A, C, 0.1, 1000.0), (B, E, 0.05, 2000.0), (D, E, 0.025, 2500.0), (A, B, 1.0, 100.0)):
        assert (topo.bandwidth_gbps(x, y), topo.distance_us(x, y)) == (pytest.approx(gbps), pytest.approx(us))


def test_a_host_no_write_reached_is_left_out(tmp_path):
    results = two_racks() + [PairResult(A, E, False, "write: no answer"), PairResult(E, A, False, "open the link")]
    links = undirected(results)
    racks = group(hosts(A, B, C, D, E), links)
    assert E not in [ip for ips in racks.members.values() for ip in ips]
    topo = load(tmp_path, topology_spec(links, racks))
    assert sorted(topo.hosts) == [A, B, C, D]


def test_nothing_measured_is_an_empty_topology(tmp_path):
    racks = group(hosts(A), {})
    assert racks.members == {} and racks.gap is None
    topo = load(tmp_path, topology_spec({}, racks, same_host=LinkFigure(4.0, 2.0)))
    assert topo.hosts == [] and topo.defaults.same_host.bandwidth == 4.0
