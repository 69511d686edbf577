"""The kills themselves, and the loop that carries out a KillSchedule during the chaos run.

A kill that cannot be done (no eligible target, a pid that is not the cluster's worker, a node
without crash_engine()) is recorded as a failure with its reason, never retried into a different
kind; each kill that was done starts a recovery watch (health.py) that runs to the end of the run
plus the grace period.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass

from raypd.benchmarks.chaos.health import HealthMonitor
from raypd.benchmarks.chaos.ray_cluster import KillRefused, RayCluster, Target
from raypd.benchmarks.chaos.schedule import KillSchedule, Kind, PlannedKill

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
                 on_kill: Callable[[Kill], None] | None = None):
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

    async def run(self, t0: float) -> None:
        """Carry out the schedule; `t0` is the chaos run's start (time.monotonic())."""
        for planned in self.schedule.planned:
            await asyncio.sleep(max(0.0, t0 + planned.t_s - time.monotonic()))
            await self._attempt(planned, t0)

    async def recovery_s(self) -> list[float | None]:
        return list(await asyncio.gather(*self.recoveries))

    async def _attempt(self, planned: PlannedKill, t0: float) -> None:
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
