"""The measurement across a Ray cluster: a LinkProbe on every alive node, every ordered pair of nodes
measured one pair at a time (pairs.py says what one pair is), and, unless asked not to, a second probe
on the first node for the same-host figure (two processes on one machine, as two raypd nodes
sharing a host).

    start a probe per node (in parallel) ─> each pair in turn: open, expect, write, settle, close
                                         ─> close every probe, then kill it (every exit path)

Bounded: every call into a probe waits at most its share of the probe's timeout (ray.get with a
timeout). A pair whose calls fail or time out is reported with the reason, and the run goes on; a
probe that has not started within start_timeout_s leaves its node out, with the reason. Ctrl-C and
SIGTERM skip the tidy-up of the pair in flight; the probes are still closed and killed (and, being
actors this driver owns, Ray ends them with the driver's job even if the driver itself is killed).
"""
from __future__ import annotations

import itertools
import secrets
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raypd.benchmarks.links.pairs import PairResult, WritePlan
from raypd.benchmarks.links.probe import LinkProbe, ProbeSpec
from raypd.benchmarks.links.racks import host_order
from raypd.cluster.launch.ray_init import reason
from raypd.conductor.topology import TOR_LABEL
from raypd.kvtransfer.data_plane_auth import DataPlaneSecret

CLOSE_TIMEOUT_S = 30.0
PROBE_CPUS = 0   # a probe mostly waits, and must start on a cluster whose CPUs raypd's nodes hold


@dataclass(frozen=True, slots=True)
class Options:
    spec: ProbeSpec
    plan: WritePlan
    same_host: bool = True
    one_way: bool = False         # each unordered pair once (lower address writes) instead of both ways
    start_timeout_s: float = 120.0


@dataclass(slots=True)
class Measurement:
    hosts: list[dict[str, Any]] = field(default_factory=list)   # each started probe's where(), plus tor_label
    unstarted: dict[str, str] = field(default_factory=dict)     # node address -> why its probe did not start
    pairs: list[PairResult] = field(default_factory=list)
    same_host: PairResult | None = None


def alive_nodes() -> list[dict[str, Any]]:
    import ray

    return [{"ip": n["NodeManagerAddress"], "node_id": n["NodeID"], "hostname": n.get("NodeManagerHostname", ""),
             "tor_label": (n.get("Labels") or {}).get(TOR_LABEL)} for n in ray.nodes() if n.get("Alive")]


class Probes:
    """The probe actors of one run; closed and killed on leaving the `with` block, however it is left."""

    def __init__(self, options: Options, secret: DataPlaneSecret):
        self.options, self.secret = options, secret
        self.handles: list[Any] = []

    def __enter__(self) -> Probes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, node_id: str) -> Any:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor = ray.remote(LinkProbe).options(
            num_cpus=PROBE_CPUS, max_restarts=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
        handle = actor.remote(self.options.spec, self.secret)
        self.handles.append(handle)
        return handle

    def close(self) -> None:
        import ray

        refs = []
        for h in self.handles:
            try:
                refs.append(h.close.remote())
            except Exception:  # noqa: BLE001 - a dead actor: nothing to close
                pass
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=CLOSE_TIMEOUT_S)
        for h in self.handles:
            try:
                ray.kill(h)
            except Exception:  # noqa: BLE001 - gone already
                pass
        self.handles = []


def measure(options: Options, secret: DataPlaneSecret, log: Callable[[str], None] = print) -> Measurement:
    import ray

    out = Measurement()
    # One probe per address: the topology's host (Ray nodes that share a machine's address are one host).
    nodes = sorted({n["ip"]: n for n in reversed(alive_nodes())}.values(), key=lambda n: host_order(n["ip"]))
    with Probes(options, secret) as probes:
        started = {n["ip"]: (n, probes.start(n["node_id"])) for n in nodes}
        ready = {ip: h.where.remote() for ip, (_, h) in started.items()}
        ray.wait(list(ready.values()), num_returns=len(ready), timeout=options.start_timeout_s)
        up: dict[str, Any] = {}
        for ip, ref in ready.items():
            try:
                out.hosts.append({**ray.get(ref, timeout=0), "tor_label": started[ip][0]["tor_label"]})
                up[ip] = started[ip][1]
            except Exception as e:  # noqa: BLE001 - reported, the others go on
                out.unstarted[ip] = _why(e, f"the probe did not start within {options.start_timeout_s:g} s")
                log(f"links: {ip}: no probe: {out.unstarted[ip]}")
        log(f"links: {len(up)} probes up ({', '.join(up)})")
        rooms = itertools.count(secrets.randbits(48))
        ips = list(up)
        for i, a in enumerate(ips):
            for j, b in enumerate(ips):
                if a == b or (options.one_way and j < i):
                    continue
                out.pairs.append(measure_pair(up[a], up[b], a, b, f"links-{i}-{j}-{secrets.token_hex(3)}",
                                              options, rooms))
                log(line(out.pairs[-1]))
        if options.same_host and ips:
            twin = probes.start(started[ips[0]][0]["node_id"])
            out.same_host = measure_pair(up[ips[0]], twin, ips[0], ips[0], f"links-same-{secrets.token_hex(3)}",
                                         options, rooms, start_timeout_s=options.start_timeout_s)
            log(line(out.same_host) + "  (two processes on one machine)")
    return out


def measure_pair(src: Any, dst: Any, src_ip: str, dst_ip: str, name: str, options: Options,
                 room_ids: itertools.count, start_timeout_s: float = 0.0) -> PairResult:
    """One ordered pair (see pairs.py); a failure becomes the result's reason."""
    import ray

    spec, plan = options.spec, options.plan
    t = spec.timeout_s
    rooms = [(next(room_ids), n) for n in plan.block_counts()]
    timings: list[dict[str, float]] = []
    step, why = "", ""
    try:
        if start_timeout_s:
            step = "start the second probe"
            ray.get(dst.where.remote(), timeout=start_timeout_s)
        step = "open the link"
        address = ray.get(src.open_link.remote(name), timeout=t)
        step = "reserve the destination"
        ray.get(dst.expect.remote(name, address, rooms), timeout=t)
        step = "write"
        timings = ray.get(src.write.remote(name, rooms), timeout=t * len(rooms))
    except Exception as e:  # noqa: BLE001 - the pair is reported unreachable, the run goes on
        why = f"{step}: {_why(e, f'no answer within the timeout ({t:g} s per call)')}"
    transport: dict[str, Any] = {}
    try:
        failures = ray.get(dst.settle.remote(name, [r for r, _ in rooms], not why), timeout=2 * t + 10)
        why = why or "; ".join(failures[:3])
    except Exception as e:  # noqa: BLE001 - a probe that cannot tidy up is killed at the end anyway
        why = why or f"settle the rooms: {_why(e, 'no answer within the timeout')}"
    try:
        transport = ray.get(src.close_link.remote(name), timeout=t)
    except Exception as e:  # noqa: BLE001 - as above
        why = why or f"close the link: {_why(e, 'no answer within the timeout')}"
    if why:
        return PairResult(src_ip, dst_ip, False, why, transport=transport)
    timed = timings[plan.warmup:]
    small, big = timed[:plan.reps], timed[plan.reps:]
    return PairResult(src_ip, dst_ip, True, "", plan.block_bytes, plan.blocks * plan.block_bytes,
                      tuple(x["write_s"] for x in small), tuple(x["write_s"] for x in big),
                      statistics.median(x["room_s"] for x in small), transport)


def line(r: PairResult) -> str:
    """One pair as the progress log prints it."""
    f = r.figure
    if f is None:
        return f"links: {r.src} -> {r.dst}: unreachable: {r.reason}"
    transports = ",".join(r.transport.get("transports") or ()) or "transport unknown"
    return f"links: {r.src} -> {r.dst}: {f.gbps:.3g} GB/s, {f.latency_us:.0f} us  [{transports}]"


def _why(e: BaseException, timeout_text: str) -> str:
    import ray.exceptions

    if isinstance(e, ray.exceptions.GetTimeoutError):
        return timeout_text
    return reason(e)
