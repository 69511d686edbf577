"""Network topology: a networkx graph of hosts and switches, and precomputed host-to-host distances.

Graph: nodes carry `kind` ("host", "tor", "spine", "nvlink", or any other switch kind); edges carry
`bandwidth` (GB/s, one direction) and `latency_us`. Hosts attach only to switches (a NIC to its ToR,
a GPU board to its NVLink domain); hosts never forward traffic for other hosts.

Precomputation (on every join or leave, never per request):
  1. switch to switch: Dijkstra by latency over the switches only (few of them); the path's
     bandwidth is its narrowest link;
  2. host to host: for every pair of attachments, uplink + switch path + downlink; the lowest
     latency wins and its bottleneck is the pair's bandwidth. Vectorized over all host pairs, so
     1000 hosts cost ~10-30 ms; the results are two dense matrices the policies index by host id.
Distances are latencies in microseconds (the seed's hop classes - same host, same ToR, same spine -
fall out of them); equal-cost paths count once (no ECMP striping).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np

from raypd.conductor.errors import TopologyError

TOR_LABEL = "raypd.io/tor"
SPINE_LABEL = "raypd.io/spine"
NVLINK_LABEL = "raypd.io/nvlink-domain"
DEFAULT_TOR = "tor-default"
DEFAULT_SPINE = "spine-default"
CORE = "core-default"


@dataclass(frozen=True, slots=True)
class LinkSpec:
    bandwidth: float   # GB/s, one direction
    latency_us: float


@dataclass(frozen=True, slots=True)
class TopologyDefaults:
    host_tor: LinkSpec = LinkSpec(50.0, 2.0)        # one 400 Gb/s NIC
    tor_spine: LinkSpec = LinkSpec(400.0, 1.0)
    host_nvlink: LinkSpec = LinkSpec(450.0, 1.0)    # H100 NVLink4, one direction
    # Two processes on one machine; 6 GB/s is what kvtransfer's NIXL backend measured on the
    # 2-core development VM (docs/benchmarks.md); a GPU box would use NVLink or PCIe figures.
    same_host: LinkSpec = LinkSpec(6.0, 0.0)


@dataclass(slots=True)
class _Attach:
    switch: str
    link: LinkSpec


@dataclass(slots=True)
class _HostSlot:
    name: str
    index: int
    attachments: list[_Attach] = field(default_factory=list)


class Topology:
    def __init__(self, defaults: TopologyDefaults = TopologyDefaults()):
        self.defaults = defaults
        self.graph = nx.Graph()
        self._hosts: dict[str, _HostSlot] = {}
        self._free: list[int] = []
        self._capacity = 0
        self.latency = np.zeros((0, 0))     # us; inf where unreachable
        self.bandwidth = np.zeros((0, 0))   # GB/s; 0 where unreachable
        self.seconds_per_byte = np.zeros((0, 0))   # 1 / bandwidth, finite (1 s/B where unreachable)
        self._switch_ids: dict[str, int] = {}
        self._s_lat = np.zeros((0, 0))
        self._s_bw = np.zeros((0, 0))
        self._switches_dirty = True
        self.num_rebuilds = 0

    # -- building -----------------------------------------------------------------------------
    def add_switch(self, name: str, kind: str = "switch") -> None:
        if name in self._hosts:
            raise TopologyError(f"{name!r} is a host")
        if name not in self.graph:
            self.graph.add_node(name, kind=kind)
            self._switches_dirty = True

    def add_link(self, a: str, b: str, bandwidth: float, latency_us: float) -> None:
        """A link between two switches (host links come with add_host)."""
        for x in (a, b):
            if x not in self.graph:
                raise TopologyError(f"unknown switch {x!r}; add it first")
            if self.graph.nodes[x]["kind"] == "host":
                raise TopologyError(f"{x!r} is a host; attach hosts with add_host")
        if bandwidth <= 0 or latency_us < 0:
            raise TopologyError(f"link {a}-{b}: bandwidth must be > 0 and latency >= 0")
        self.graph.add_edge(a, b, bandwidth=float(bandwidth), latency_us=float(latency_us))
        self._switches_dirty = True

    def add_host(self, name: str, attach: Mapping[str, LinkSpec] | None = None, *,
                 tor: str | None = None, nvlink_domain: str | None = None, rebuild: bool = True) -> int:
        """Attach a host to switches (created with default links to the default spine when
        unknown). With neither `attach` nor `tor` the host joins the default ToR."""
        links: dict[str, LinkSpec] = dict(attach or {})
        if tor is not None or not links:
            links.setdefault(tor or DEFAULT_TOR, self.defaults.host_tor)
        if nvlink_domain is not None:
            links.setdefault(nvlink_domain, self.defaults.host_nvlink)
        for sw in links:
            if sw not in self.graph:
                self._auto_switch(sw, "nvlink" if sw == nvlink_domain else "tor")
        if name in self._hosts:
            self.remove_host(name, rebuild=False)
        slot = _HostSlot(name, self._take_index(), [_Attach(sw, ln) for sw, ln in links.items()])
        self._hosts[name] = slot
        self.graph.add_node(name, kind="host")
        for a in slot.attachments:
            self.graph.add_edge(name, a.switch, bandwidth=a.link.bandwidth, latency_us=a.link.latency_us)
        if rebuild:
            self.rebuild()
        return slot.index

    def remove_host(self, name: str, rebuild: bool = True) -> None:
        slot = self._hosts.pop(name, None)
        if slot is None:
            return
        self.graph.remove_node(name)
        self._free.append(slot.index)
        if rebuild:
            self.rebuild()

    def ensure_host(self, name: str) -> int:
        """The host's index, attaching an unknown host to the default ToR (joined to the rest)."""
        slot = self._hosts.get(name)
        if slot is not None:
            return slot.index
        idx = self.add_host(name, rebuild=False)
        self.connect_components()
        self.rebuild()
        return idx

    def connect_components(self) -> None:
        """Join switch islands through a core switch: hosts of one Ray cluster can always reach
        each other, and a partly labelled cluster must not come out partitioned."""
        switches = [x for x, d in self.graph.nodes(data=True) if d["kind"] != "host"]
        parts = list(nx.connected_components(self.graph.subgraph(switches)))
        if len(parts) < 2:
            return
        self.add_switch(CORE, "core")
        link = self.defaults.tor_spine
        for part in parts:
            if CORE in part:
                continue
            top = next((x for x in part if self.graph.nodes[x]["kind"] == "spine"), min(part))
            self.add_link(top, CORE, link.bandwidth, link.latency_us)

    # -- queries ------------------------------------------------------------------------------
    def host_index(self, name: str) -> int:
        try:
            return self._hosts[name].index
        except KeyError:
            raise TopologyError(f"unknown host {name!r}") from None

    def has_host(self, name: str) -> bool:
        return name in self._hosts

    @property
    def hosts(self) -> list[str]:
        return list(self._hosts)

    def distance_us(self, a: str, b: str) -> float:
        return float(self.latency[self.host_index(a), self.host_index(b)])

    def bandwidth_gbps(self, a: str, b: str) -> float:
        return float(self.bandwidth[self.host_index(a), self.host_index(b)])

    def transfer_s(self, a: str, b: str, nbytes: float) -> float:
        return transfer_seconds(nbytes, self.bandwidth_gbps(a, b), self.distance_us(a, b))

    def tor_of(self, host: str) -> str | None:
        for a in self._hosts[host].attachments:
            if self.graph.nodes[a.switch]["kind"] == "tor":
                return a.switch
        return None

    # -- precomputation -----------------------------------------------------------------------
    def rebuild(self) -> None:
        if self._switches_dirty:
            self._rebuild_switches()
        n = self._capacity
        lat = np.full((n, n), np.inf)
        bw = np.zeros((n, n))
        slots = list(self._hosts.values())
        if slots:
            k = max(len(s.attachments) for s in slots)
            idx = np.array([s.index for s in slots])
            sw = np.zeros((len(slots), k), dtype=np.int64)
            up_lat = np.full((len(slots), k), np.inf)
            up_bw = np.zeros((len(slots), k))
            for i, s in enumerate(slots):
                for j, a in enumerate(s.attachments):
                    sw[i, j] = self._switch_ids[a.switch]
                    up_lat[i, j] = a.link.latency_us
                    up_bw[i, j] = a.link.bandwidth
            best_lat = np.full((len(slots), len(slots)), np.inf)
            best_bw = np.zeros((len(slots), len(slots)))
            for j1 in range(k):
                for j2 in range(k):
                    s_lat = self._s_lat[np.ix_(sw[:, j1], sw[:, j2])]
                    s_bw = self._s_bw[np.ix_(sw[:, j1], sw[:, j2])]
                    cand_lat = up_lat[:, j1, None] + s_lat + up_lat[None, :, j2]
                    cand_bw = np.minimum(np.minimum(up_bw[:, j1, None], s_bw), up_bw[None, :, j2])
                    better = cand_lat < best_lat
                    best_lat = np.where(better, cand_lat, best_lat)
                    best_bw = np.where(better, cand_bw, best_bw)
            lat[np.ix_(idx, idx)] = best_lat
            bw[np.ix_(idx, idx)] = best_bw
            lat[idx, idx] = self.defaults.same_host.latency_us
            bw[idx, idx] = self.defaults.same_host.bandwidth
        self.latency, self.bandwidth = lat, bw
        # the policies multiply by this (a division per candidate per request would cost more)
        self.seconds_per_byte = np.where(bw > 0, 1.0 / np.maximum(bw, 1e-12) * 1e-9, 1.0)
        self.num_rebuilds += 1

    def _rebuild_switches(self) -> None:
        switches = [x for x, d in self.graph.nodes(data=True) if d["kind"] != "host"]
        self._switch_ids = {x: i for i, x in enumerate(switches)}
        sub = self.graph.subgraph(switches)
        m = len(switches)
        s_lat = np.full((m, m), np.inf)
        s_bw = np.zeros((m, m))
        for src in switches:
            i = self._switch_ids[src]
            dist, paths = nx.single_source_dijkstra(sub, src, weight="latency_us")
            for dst, d in dist.items():
                j = self._switch_ids[dst]
                path = paths[dst]
                s_lat[i, j] = d
                s_bw[i, j] = min((sub.edges[u, v]["bandwidth"] for u, v in zip(path, path[1:])),
                                 default=np.inf)
        self._s_lat, self._s_bw = s_lat, s_bw
        self._switches_dirty = False

    def _auto_switch(self, name: str, kind: str) -> None:
        self.add_switch(name, kind)
        if kind == "tor":
            self.add_switch(DEFAULT_SPINE, "spine")
            self.add_link(name, DEFAULT_SPINE, self.defaults.tor_spine.bandwidth,
                          self.defaults.tor_spine.latency_us)

    def _take_index(self) -> int:
        if self._free:
            return self._free.pop()
        self._capacity += 1
        return self._capacity - 1

    # -- constructors -------------------------------------------------------------------------
    @classmethod
    def single_machine(cls, host: str = "localhost", defaults: TopologyDefaults = TopologyDefaults()) -> Topology:
        topo = cls(defaults)
        topo.add_host(host)
        return topo

    @classmethod
    def from_ray_labels(cls, labels: Mapping[str, Mapping[str, str]],
                        defaults: TopologyDefaults = TopologyDefaults()) -> Topology:
        """Hosts from Ray node labels: {node_id: {"raypd.io/tor": "tor-1", "raypd.io/spine":
        "spine-0", "raypd.io/nvlink-domain": "nvl-3"}}. A ToR without a spine label hangs off the
        default spine; a node without a ToR label sits on the default ToR."""
        topo = cls(defaults)
        for node_id, lab in labels.items():
            tor = lab.get(TOR_LABEL) or DEFAULT_TOR
            spine = lab.get(SPINE_LABEL)
            if spine:
                topo.add_switch(tor, "tor")
                topo.add_switch(spine, "spine")
                if not topo.graph.has_edge(tor, spine):
                    topo.add_link(tor, spine, defaults.tor_spine.bandwidth, defaults.tor_spine.latency_us)
            topo.add_host(node_id, tor=tor, nvlink_domain=lab.get(NVLINK_LABEL), rebuild=False)
        topo.connect_components()
        topo.rebuild()
        return topo

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any]) -> Topology:
        """The YAML layout:

            defaults: {host_tor: {bandwidth: 50, latency_us: 2}, same_host: {...}, ...}
            switches: [{name: spine-0, kind: spine}, {name: tor-0, kind: tor}]
            links:    [{a: tor-0, b: spine-0, bandwidth: 400, latency_us: 1}]
            hosts:    [{name: node-a, tor: tor-0, nvlink_domain: nvl-0},
                       {name: node-b, attach: [{switch: tor-0, bandwidth: 25, latency_us: 3}]}]
        Bandwidths are GB/s, latencies microseconds."""
        d = TopologyDefaults()
        over = spec.get("defaults") or {}
        defaults = TopologyDefaults(**{k: _link(over[k]) if k in over else getattr(d, k)
                                       for k in ("host_tor", "tor_spine", "host_nvlink", "same_host")})
        unknown = set(over) - {"host_tor", "tor_spine", "host_nvlink", "same_host"}
        if unknown:
            raise TopologyError(f"unknown defaults {sorted(unknown)}")
        topo = cls(defaults)
        for sw in spec.get("switches") or []:
            topo.add_switch(sw["name"], sw.get("kind", "switch"))
        for ln in spec.get("links") or []:
            topo.add_link(ln["a"], ln["b"], float(ln["bandwidth"]), float(ln.get("latency_us", 1.0)))
        for h in spec.get("hosts") or []:
            attach = {a["switch"]: _link(a) for a in h.get("attach") or []}
            topo.add_host(h["name"], attach or None, tor=h.get("tor"), nvlink_domain=h.get("nvlink_domain"),
                          rebuild=False)
        topo.rebuild()
        return topo

    @classmethod
    def from_yaml(cls, path: str | Path) -> Topology:
        return cls.from_yaml_text(Path(path).read_text())

    @classmethod
    def from_yaml_text(cls, text: str) -> Topology:
        import yaml

        spec = yaml.safe_load(text) or {}
        if not isinstance(spec, dict):
            raise TopologyError("a topology YAML is a mapping with switches, links and hosts")
        return cls.from_dict(spec)


def transfer_seconds(nbytes: float, bandwidth_gbps: float, latency_us: float) -> float:
    if bandwidth_gbps <= 0:
        return float("inf")
    return nbytes / (bandwidth_gbps * 1e9) + latency_us * 1e-6


def _link(d: Mapping[str, Any]) -> LinkSpec:
    try:
        return LinkSpec(float(d["bandwidth"]), float(d.get("latency_us", 1.0)))
    except (KeyError, TypeError, ValueError) as e:
        raise TopologyError(f"bad link spec {d!r}: {e}") from None
