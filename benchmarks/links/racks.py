"""Racks from the measurement: which hosts sit close together, told by the bandwidth between them.

The rule, the largest gap: sort the measured links' bandwidths from high to low and find the largest
ratio between two neighbours in that order. If it is at least `min_gap` (default 3), the links above
it are near, and the racks are the connected components of the hosts joined by near links; if not,
the network is flat and one rack holds every host. Why a gap rather than a fixed share of the best
link: links inside one rack differ (2x between runs on a busy machine, where TCP is CPU-bound), and
what marks a rack is the step down to the links that leave it (10x and more: a rack's switch
against a rate-limited uplink, NVLink or a rail against the spine); a fixed share splits a rack on
noise or merges two racks behind a fast spine. With three levels (rack, pod, spine) the largest
step wins. Hosts no link reached are left out (the report lists them as unreachable).

Ray's raypd.io/tor label only names a rack: the rack is named after it when every host in it has
the same label and no other rack does; else rack-0, rack-1, ... in the order of each rack's first host.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from raypd.benchmarks.links.pairs import Host, LinkFigure

DEFAULT_MIN_GAP = 3.0


@dataclass(frozen=True, slots=True)
class Racks:
    members: dict[str, tuple[str, ...]]   # rack name -> its hosts' IPs, in address order
    gap: float | None                     # the largest ratio between neighbouring bandwidths
    near_gbps: float | None               # near links have at least this; None: flat (one rack)

    def rack_of(self, ip: str) -> str:
        return next(name for name, ips in self.members.items() if ip in ips)


def host_order(ip: str) -> tuple[int, int, str]:
    """Sort key: by address where it is one (198.18.0.9 before 198.18.0.10), else by name."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return (9, 0, ip)
    return (addr.version, int(addr), ip)


def largest_gap(bandwidths: list[float]) -> tuple[float, float] | None:
    """(ratio, the bandwidth just above it) of the largest step down in `bandwidths`; None with
    fewer than two."""
    ordered = sorted((b for b in bandwidths if b > 0), reverse=True)
    steps = [(hi / lo, hi) for hi, lo in zip(ordered, ordered[1:])]
    return max(steps) if steps else None


def group(hosts: list[Host], links: Mapping[frozenset[str], LinkFigure], min_gap: float = DEFAULT_MIN_GAP) -> Racks:
    """The racks of the hosts that some link reached (see the module docstring)."""
    reached = sorted({ip for pair in links for ip in pair}, key=host_order)
    step = largest_gap([f.gbps for f in links.values()])
    near = step[1] if step is not None and step[0] >= min_gap else None
    parent = {ip: ip for ip in reached}

    def root(ip: str) -> str:
        while parent[ip] != ip:
            parent[ip] = parent[parent[ip]]
            ip = parent[ip]
        return ip

    for pair, f in links.items():
        if near is None or f.gbps >= near:
            a, b = sorted(pair)
            parent[root(a)] = root(b)
    parts: dict[str, list[str]] = {}
    for ip in reached:   # in address order, so each part's first host is its lowest
        parts.setdefault(root(ip), []).append(ip)
    ordered = sorted(parts.values(), key=lambda ips: host_order(ips[0]))
    names = _names(ordered, {h.ip: h.tor_label for h in hosts})
    return Racks({name: tuple(ips) for name, ips in zip(names, ordered)}, step[0] if step else None, near)


def _names(parts: list[list[str]], labels: Mapping[str, str | None]) -> list[str]:
    shared = [{labels.get(ip) for ip in ips} for ips in parts]
    single = [next(iter(s)) if len(s) == 1 else None for s in shared]
    taken = [label for label in single if label]
    names = [label if label and taken.count(label) == 1 else f"rack-{i}" for i, label in enumerate(single)]
    return names if len(set(names)) == len(names) else [f"rack-{i}" for i in range(len(parts))]
