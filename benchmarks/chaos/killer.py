"""The kills themselves, and the loop that carries out a KillSchedule during the chaos run.

A kill that cannot be done (no eligible target, a pid that is not the cluster's worker, a node
without crash_engine()) is recorded as a failure with its reason, never retried into a different
kind; each kill that was done starts a recovery watch (health.py) that runs to the end of the run
plus the grace period.

On the lab, host kinds (schedule.py) go through a HostFaults (lab_mode.py: the process that owns the
lab does them). Right before one, the killer notes which raypd nodes run on the host (Ray's actor
table) and the Conductor's latest routes, so the report can say which streams were on it. A host
kill's watch waits for those nodes live again in a new incarnation (restarted on another host); a
partition's restores the link after `partition_s` (also when the run is cut short) and waits for
those nodes live again under the same names.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

from raypd.benchmarks.chaos.health import HealthMonitor
from raypd.benchmarks.chaos.ray_cluster import KillRefused, RayCluster, Route, Target
from raypd.benchmarks.chaos.schedule import CONDUCTOR, HOST_KINDS, KillSchedule, Kind, PlannedKill

CRASH_TIMEOUT_S = 10.0


class KillFailed(RuntimeError):
    """The kill was attempted and did not happen; the message says why."""


@dataclass(frozen=True)
class Kill:
    t_s: float                      # seconds after the chaos run started
    target: str
    kind: Kind
    role: str
    pid: int
    incarnation_before: int | None  # from /health/ready just before the kill

    def as_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class KillFailure:
    t_s: float
    kind: Kind
    target: str | None
    error: str

    def as_json(self) -> dict:
        return asdict(self)


@dataclass
class HostFault:
    """A host kill or partition that was done, and what was on the host right before it."""
    t_s: float
    kind: Kind
    host: str
    role: str
    ip: str
    nodes: dict[str, int | None]                  # raypd node on the host -> its incarnation before
    routes: dict[str, Route] | None = field(default=None, repr=False)  # the Conductor's, read just after
    wall_time: float = 0.0                        # time.time() of the fault, to place the routes
    processes_killed: int = 0
    restored_at_s: float | None = None            # a partition's link back up (seconds after the run's start)
    unknown: str = ""                             # why the nodes on the host or the routes are not known

    def as_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "routes"} | {
            "routes_known": self.routes is not None}


class LabHost(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def role(self) -> str: ...

    @property
    def ip(self) -> str: ...


class HostFaults(Protocol):
    """What the lab lets the run do to a host (the head host is not among `hosts`)."""
    @property
    def hosts(self) -> Sequence[LabHost]: ...

    def kill_host(self, name: str) -> int: ...   # processes killed; KillFailed if it could not

    def cut(self, name: str) -> None: ...

    def restore(self, name: str) -> None: ...


def perform(cluster: RayCluster, kind: Kind, target: Target) -> None:
    """Do one kill of `kind` to `target`; KillFailed (or KillRefused) if it did not happen."""
    ray = cluster.ray
    try:
        if kind == "ray_kill":
            ray.kill(cluster.handle(target), no_restart=False)
        elif kind == "sigkill":
            os.kill(cluster.worker_process(target.pid).pid, signal.SIGKILL)
        elif kind == "engine_crash":
            handle = cluster.handle(target)
            try:
                method = handle.crash_engine
            except AttributeError:
                raise KillFailed(f"{target.class_name} has no crash_engine(): the server lacks the engine-crash "
                                 "hook") from None
            try:
                ray.get(method.remote(), timeout=CRASH_TIMEOUT_S)
            except ray.exceptions.RayActorError:
                pass  # the actor died answering: that is the crash
            except ray.exceptions.GetTimeoutError:
                raise KillFailed(f"crash_engine() did not answer within {CRASH_TIMEOUT_S:.0f}s") from None
        else:
            raise KillFailed(f"unknown kill kind {kind!r}")
    except (KillFailed, KillRefused):
        raise
    except Exception as e:  # noqa: BLE001 - Ray's lookups and calls raise many types; all mean "not done"
        raise KillFailed(f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}") from e


class Killer:
    def __init__(self, schedule: KillSchedule, cluster: RayCluster, monitor: HealthMonitor,
                 probe: Callable[[], Awaitable[bool]], recovery_deadline: float, every_s: float,
                 on_kill: Callable[[Kill], None] | None = None, lab: HostFaults | None = None,
                 partition_s: float = 20.0):
        self.schedule = schedule
        self.cluster = cluster
        self.monitor = monitor
        self.probe = probe
        self.recovery_deadline = recovery_deadline   # time.monotonic()
        self.retry_s = min(10.0, every_s / 2)        # how long a kill waits for an eligible target
        self.on_kill = on_kill
        self.kills: list[Kill] = []
        self.failures: list[KillFailure] = []
        self.recoveries: list[asyncio.Task] = []     # one per kill, same order
        self._watching: dict[str, asyncio.Task] = {}  # target name -> the recovery watch of its last kill
        self.lab = lab
        self.partition_s = partition_s
        self.host_faults: list[HostFault] = []
        self.lost: set[str] = set()      # hosts killed (they stay lost)
        self.cut_off: set[str] = set()   # hosts whose link is down now

    async def run(self, t0: float) -> None:
        """Carry out the schedule; `t0` is the chaos run's start (time.monotonic())."""
        for planned in self.schedule.planned:
            await asyncio.sleep(max(0.0, t0 + planned.t_s - time.monotonic()))
            await self._attempt(planned, t0)

    async def recovery_s(self) -> list[float | None]:
        return list(await asyncio.gather(*self.recoveries))

    async def _attempt(self, planned: PlannedKill, t0: float) -> None:
        if planned.kind in HOST_KINDS:
            await self._host_fault(planned.kind, t0)
            return
        give_up = time.monotonic() + self.retry_s
        why = "no eligible target"
        while True:
            try:
                targets = await asyncio.to_thread(self.cluster.targets)
            except Exception as e:  # noqa: BLE001 - the state API down is a failed kill, not a crash
                targets, why = None, f"listing the cluster's actors failed: {type(e).__name__}: {e}"
            if targets is not None:
                await self.monitor.read()  # fresh states and incarnations, right before the kill
                live = self.monitor.live_names(targets)
                # The server's and Ray's views of a death can lag behind it: a member killed before is
                # not live again until its recovery watch says so.
                recovering = {name for name, watch in self._watching.items() if not watch.done()}
                live = (live if live is not None else {t.name for t in targets}) - recovering
                target = self.schedule.pick(planned.kind, targets, live)
                if target is not None:
                    await self._kill(planned.kind, target, t0)
                    return
            if time.monotonic() >= give_up:
                self.failures.append(KillFailure(round(time.monotonic() - t0, 3), planned.kind, None, why))
                return
            await asyncio.sleep(max(0.0, min(1.0, give_up - time.monotonic())))

    async def _kill(self, kind: Kind, target: Target, t0: float) -> None:
        before = self.monitor.incarnation(target.name, target.role)
        killed_at = time.monotonic()
        try:
            await asyncio.to_thread(perform, self.cluster, kind, target)
        except (KillFailed, KillRefused) as e:
            self.failures.append(KillFailure(round(killed_at - t0, 3), kind, target.name, str(e)))
            return
        kill = Kill(round(killed_at - t0, 3), target.name, kind, target.role, target.pid, before)
        self.kills.append(kill)
        watch = asyncio.create_task(self.monitor.recovery_s(target.name, target.role, before, killed_at,
                                                            self.recovery_deadline, self.probe))
        self.recoveries.append(watch)
        self._watching[target.name] = watch
        if self.on_kill is not None:
            self.on_kill(kill)

    async def _host_fault(self, kind: Kind, t0: float) -> None:
        now_s = round(time.monotonic() - t0, 3)
        if self.lab is None:
            self.failures.append(KillFailure(now_s, kind, None, "host faults need the lab (--lab)"))
            return
        live = {h.name for h in self.lab.hosts} - self.lost - self.cut_off
        host = self.schedule.pick_host(kind, self.lab.hosts, live)
        if host is None:
            why = "no host left that is neither lost nor cut off" + (
                " (a host kill spares the last live host of a role)" if kind == "host_kill" else "")
            self.failures.append(KillFailure(now_s, kind, None, why))
            return
        nodes, unknown = await self._on_host(host.ip)
        killed_at, wall_time = time.monotonic(), time.time()
        try:
            if kind == "host_kill":
                killed = await asyncio.to_thread(self.lab.kill_host, host.name)
            else:
                killed = 0
                await asyncio.to_thread(self.lab.cut, host.name)
        except Exception as e:  # noqa: BLE001 - the lab's failure is a fault not done, with its reason
            self.failures.append(KillFailure(round(killed_at - t0, 3), kind, host.name, f"{type(e).__name__}: {e}"))
            return
        # Read after the fault, so that every route decided before it is in; the report places each
        # stream by the latest decision before wall_time (its replay's comes after).
        try:
            routes, why = await asyncio.to_thread(self.cluster.routes, await asyncio.to_thread(self.cluster.targets))
        except Exception as e:  # noqa: BLE001 - the report says the routes are not known, and why
            routes, why = None, f"{type(e).__name__}: {e}"[:300]
        fault = HostFault(round(killed_at - t0, 3), kind, host.name, host.role, host.ip, nodes, routes, wall_time,
                          killed, unknown="; ".join(w for w in (unknown, why) if w))
        self.host_faults.append(fault)
        kill = Kill(fault.t_s, host.name, kind, host.role, 0, None)
        self.kills.append(kill)
        if kind == "host_kill":
            self.lost.add(host.name)
            watch = self.monitor.nodes_back_s(nodes, killed_at, killed_at, self.recovery_deadline, self.probe,
                                              newer=True)
        else:
            self.cut_off.add(host.name)
            watch = self._partition(fault, killed_at, t0)
        self.recoveries.append(asyncio.create_task(watch))
        if self.on_kill is not None:
            self.on_kill(kill)

    async def _on_host(self, ip: str) -> tuple[dict[str, int | None], str]:
        """The raypd nodes on the host at `ip` (-> incarnation), and why they are not known ("" when they are)."""
        try:
            targets = await asyncio.to_thread(self.cluster.targets)
            ips = await asyncio.to_thread(self.cluster.node_ips)
        except Exception as e:  # noqa: BLE001 - the fault still happens; the report says nothing was known
            return {}, f"the nodes on the host: {type(e).__name__}: {e}"[:300]
        await self.monitor.read()
        return {t.name: self.monitor.incarnation(t.name, t.role) for t in targets
                if t.role != CONDUCTOR and ips.get(t.node_id) == ip}, ""

    async def _partition(self, fault: HostFault, cut_at: float, t0: float) -> float | None:
        """Restore the link after partition_s (at once if cancelled), then the nodes' way back."""
        assert self.lab is not None
        try:
            await asyncio.sleep(max(0.0, cut_at + self.partition_s - time.monotonic()))
        finally:
            try:
                self.lab.restore(fault.host)  # blocking, briefly: it must happen even when cancelled
            except Exception as e:  # noqa: BLE001 - the lab's owner restores every link at its end too
                self.failures.append(KillFailure(round(time.monotonic() - t0, 3), "partition", fault.host,
                                                 f"restoring the link failed: {type(e).__name__}: {e}"))
            restored = time.monotonic()
            fault.restored_at_s = round(restored - t0, 3)
            self.cut_off.discard(fault.host)
        return await self.monitor.nodes_back_s(fault.nodes, restored, cut_at, self.recovery_deadline, self.probe,
                                               newer=False)
