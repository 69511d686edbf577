"""The topology file `raypd serve --topology` reads (conductor/topology.py, Topology.from_dict), built from
the measured links and the racks found in them (racks.py).

    switches  one `tor` per rack
    hosts     each host, named by IP (ConductorCore.host_key matches a node's IP, and an IP outlives a
              Ray restart), attached to its rack's switch with the median of its links inside the
              rack and half their median latency: a path host -> switch -> host adds both ends'
              latencies and takes the narrower end's bandwidth, so an in-rack pair comes out at its
              measured figures. A host alone in its rack gets its fastest link and half its lowest
              latency, so that its own uplink narrows no path more than the measurement did.
    links     between every two racks that a measured link joins: the median bandwidth of those links,
              and the median of each one's latency less both ends' uplink latencies (at least 0)
    defaults  same_host from the same-host pair when it was measured; host_tor and tor_spine from the
              medians of the uplinks and rack links, for a host that joins later (the Conductor puts
              an unknown host on a default rack with these figures)

The Conductor's topology routes every pair by the lowest latency (conductor/topology.py), so two racks
whose measured latency exceeds a path through a third rack get that path's figures. Figures are
rounded to 4 significant digits.
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

import yaml

from raypd.benchmarks.links.pairs import LinkFigure
from raypd.benchmarks.links.racks import Racks


def topology_spec(links: Mapping[frozenset[str], LinkFigure], racks: Racks,
                  same_host: LinkFigure | None = None) -> dict[str, Any]:
    """The Topology.from_dict mapping for the racks' hosts."""
    uplinks = {ip: _uplink(ip, frozenset(ips), links) for ips in racks.members.values() for ip in ips}
    between: dict[tuple[str, str], LinkFigure] = {}
    names = list(racks.members)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            across = [(pair, f) for pair, f in links.items() if {racks.rack_of(ip) for ip in pair} == {a, b}]
            if across:
                between[a, b] = LinkFigure(
                    statistics.median(f.gbps for _, f in across),
                    statistics.median(max(0.0, f.latency_us - sum(uplinks[ip].latency_us for ip in pair))
                                      for pair, f in across))
    defaults = {}
    if uplinks:
        defaults["host_tor"] = _spec(_median(list(uplinks.values())))
    if between:
        defaults["tor_spine"] = _spec(_median(list(between.values())))
    if same_host is not None:
        defaults["same_host"] = _spec(same_host)
    return {"defaults": defaults,
            "switches": [{"name": rack, "kind": "tor"} for rack in names],
            "links": [{"a": a, "b": b, **_spec(f)} for (a, b), f in between.items()],
            "hosts": [{"name": ip, "attach": [{"switch": racks.rack_of(ip), **_spec(up)}]}
                      for ip, up in uplinks.items()]}


def to_yaml(spec: Mapping[str, Any], comment: list[str]) -> str:
    """The YAML text with `comment` as its opening # lines (what made it, and how to use it)."""
    head = "".join(f"# {line}\n" for line in comment)
    return head + yaml.safe_dump(dict(spec), sort_keys=False, default_flow_style=None, width=120)


def _uplink(ip: str, rack: frozenset[str], links: Mapping[frozenset[str], LinkFigure]) -> LinkFigure:
    mine = [(pair, f) for pair, f in links.items() if ip in pair]
    inside = [f for pair, f in mine if pair <= rack]
    if inside:
        return LinkFigure(statistics.median(f.gbps for f in inside), statistics.median(f.latency_us for f in inside) / 2)
    return LinkFigure(max(f.gbps for _, f in mine), min(f.latency_us for _, f in mine) / 2)


def _median(figures: list[LinkFigure]) -> LinkFigure:
    return LinkFigure(statistics.median(f.gbps for f in figures), statistics.median(f.latency_us for f in figures))


def _spec(f: LinkFigure) -> dict[str, float]:
    return {"bandwidth": _round(f.gbps), "latency_us": _round(f.latency_us)}


def _round(x: float) -> float:
    return float(f"{x:.4g}")
