"""What `raypd bench links` writes with --json (every pair's figures and transport, the racks, the
topology, the machines, the command) and the table it prints."""
from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from raypd.benchmarks.links.measure import Measurement
from raypd.benchmarks.links.pairs import LinkFigure, PairResult
from raypd.benchmarks.links.racks import Racks, host_order

RACK_RULE = ("racks: connected components of the links at or above the largest step down in the sorted "
             "bandwidths, when that step is at least --min-gap; otherwise one rack (a flat network)")


def pair_row(r: PairResult) -> dict[str, Any]:
    f = r.figure
    row = asdict(r)
    row.update({"gbps": f.gbps if f else None, "latency_us": f.latency_us if f else None,
                "small_write_s_median": statistics.median(r.small_write_s) if r.small_write_s else None,
                "big_write_s_median": statistics.median(r.big_write_s) if r.big_write_s else None})
    return row


def network_only(pairs: list[PairResult]) -> bool | None:
    """Did every write between two different hosts take a network transport? None when some
    transport is unknown (and none was a same-machine one)."""
    seen = [r.transport.get("network") for r in pairs if r.ok and r.src != r.dst]
    if False in seen:
        return False
    return True if seen and all(seen) else None


def labels_agree(hosts: list[dict[str, Any]], racks: Racks) -> bool | None:
    """Do the measured racks group the hosts as their raypd.io/tor labels do? None when a host has none."""
    labels = {h["ip"]: h.get("tor_label") for h in hosts}
    reached = [ip for ips in racks.members.values() for ip in ips]
    if not reached or any(not labels.get(ip) for ip in reached):
        return None
    by_label: dict[str, set[str]] = {}
    for ip in reached:
        by_label.setdefault(str(labels[ip]), set()).add(ip)
    return {frozenset(s) for s in by_label.values()} == {frozenset(ips) for ips in racks.members.values()}


def build_report(m: Measurement, links: Mapping[frozenset[str], LinkFigure], racks: Racks,
                 topology: dict[str, Any], config: dict[str, Any], command: str, machine: dict[str, Any]) -> dict:
    return {"command": command, "machine": machine, "config": config,
            "hosts": [{**h, "rack": _rack(racks, h["ip"])} for h in m.hosts], "unstarted": m.unstarted,
            "pairs": [pair_row(r) for r in m.pairs],
            "same_host": pair_row(m.same_host) if m.same_host else None,
            "links": [{"a": a, "b": b, "gbps": f.gbps, "latency_us": f.latency_us}
                      for (a, b), f in sorted(((tuple(sorted(k, key=host_order)), f) for k, f in links.items()))],
            "racks": {"members": {k: list(v) for k, v in racks.members.items()}, "largest_gap": racks.gap,
                      "near_gbps": racks.near_gbps, "rule": RACK_RULE},
            "labels_agree": labels_agree(m.hosts, racks), "network_only": network_only(m.pairs),
            "topology": topology}


def table(m: Measurement, racks: Racks) -> str:
    """The pairs, the racks, and the warnings a reader must not miss."""
    lines = [f"{'src -> dst':34s} {'GB/s':>9s} {'latency us':>11s}  transport"]
    for r in m.pairs + ([m.same_host] if m.same_host else []):
        f = r.figure
        pair = f"{r.src} -> {r.dst}" + (" (same host)" if r.src == r.dst else "")
        if f is None:
            lines.append(f"{pair:34s} {'-':>9s} {'-':>11s}  unreachable: {r.reason}")
            continue
        transport = ",".join(r.transport.get("transports") or ()) or f"unknown ({r.transport.get('note', '')})"
        scope = f" ({r.transport['scope']})" if r.transport.get("scope") else ""
        lines.append(f"{pair:34s} {f.gbps:9.4g} {f.latency_us:11.0f}  {transport}{scope}")
    if racks.near_gbps is None:
        lines.append("racks: one (no step down between the links reaches --min-gap)" if racks.members
                     else "racks: none (no link between two hosts was measured)")
    else:
        lines.append(f"racks: links of {racks.near_gbps:.4g} GB/s and more join a rack "
                     f"(the largest step down, {racks.gap:.3g}x)")
    lines += [f"  {name}: {' '.join(ips)}" for name, ips in racks.members.items()]
    for ip, why in m.unstarted.items():
        lines.append(f"  {ip}: no probe ({why})")
    if network_only(m.pairs) is False:
        lines.append("WARNING: some writes between different hosts took a same-machine transport (CMA, shared "
                     "memory): these hosts share a machine, or UCX_TLS lets UCX take such a shortcut")
    return "\n".join(lines)


def _rack(racks: Racks, ip: str) -> str | None:
    return next((name for name, ips in racks.members.items() if ip in ips), None)
