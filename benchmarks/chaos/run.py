"""One chaos run between a ready server and its stop, in phases:

    wait for /health/ready -> fault-free run (each request once: the reference)
    -> chaos run (the list cycled at --concurrency for --duration s; kills at their times;
       readiness polled; every process under the server remembered)
    -> drain (requests in flight finish) -> recoveries (bounded by the run's end + --recovery-grace)
    -> blocks held (bounded by --idle-timeout) -> the report
"""
from __future__ import annotations

import asyncio
import sys
import time

import aiohttp

from raypd.benchmarks.chaos.client import stream_one
from raypd.benchmarks.chaos.driver import Load, Record
from raypd.benchmarks.chaos.health import HealthMonitor
from raypd.benchmarks.chaos.held_blocks import HeldAfter, held_after_drain
from raypd.benchmarks.chaos.killer import HostFaults, Killer
from raypd.benchmarks.chaos.progress import Progress
from raypd.benchmarks.chaos.ray_cluster import RayCluster
from raypd.benchmarks.chaos.report import build_report
from raypd.benchmarks.chaos.schedule import HOST_KINDS, KINDS, KillSchedule
from raypd.benchmarks.chaos.workload import ChaosRequest
from raypd.benchmarks.serve.systems import Launched

PROBE = ChaosRequest(index=-1, endpoint="completion", text="The capital of France is", max_tokens=4,
                     temperature=0.0, top_p=1.0, seed=None)
PROBE_TIMEOUT_S = 30.0


async def chaos_run(args, launched: Launched, cluster: RayCluster, schedule: KillSchedule,
                    requests: list[ChaosRequest], notes: list[str], config: dict,
                    lab: HostFaults | None = None) -> dict:
    """Everything between a ready server and stopping it; the report. `lab`: the host faults (--lab)."""
    import openai

    base = f"http://127.0.0.1:{launched.port}"
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=args.request_timeout)
    async with aiohttp.ClientSession() as http:
        try:
            return await _run(args, base, client, http, launched, cluster, schedule, requests, notes, config, lab)
        finally:
            await client.close()


async def _run(args, base: str, client, http: aiohttp.ClientSession, launched: Launched, cluster: RayCluster,
               schedule: KillSchedule, requests: list[ChaosRequest], notes: list[str], config: dict,
               lab: HostFaults | None) -> dict:
    monitor = HealthMonitor(http, base)
    model = (await client.models.list()).data[0].id
    if not await monitor.wait_ready(args.ready_timeout):
        notes.append("the server never reported ready before the fault-free run")
    if monitor.missing:
        notes.append(f"{monitor.missing}; fell back to GET /health, and recovery_s cannot be measured")
    remember = asyncio.create_task(_remember(launched))
    helpers: list[asyncio.Task] = [remember]
    stop = asyncio.Event()

    async def probe() -> bool:
        return (await stream_one(client, model, PROBE, PROBE_TIMEOUT_S)).ok

    killer: Killer | None = None
    try:
        bar = Progress("fault-free run", len(requests), "req")
        reference = await Load(client, model, requests, args.concurrency, args.request_timeout, bar.record).once()
        bar.close()

        t0 = time.monotonic()
        end = t0 + args.duration
        bar = Progress("chaos run", args.duration, "s")
        killer = Killer(schedule, cluster, monitor, probe, end + args.recovery_grace, args.kill_every, bar.killed,
                        lab, getattr(args, "partition_s", 20.0))
        killing = asyncio.create_task(killer.run(t0))
        helpers += [asyncio.create_task(monitor.run(stop)), asyncio.create_task(bar.follow_clock(t0, end)), killing]
        chaos: list[Record] = await Load(client, model, requests, args.concurrency, args.request_timeout,
                                         bar.record).until(end)
        await killing  # the last kill may still be looking for a target
        bar.close()
        print(f"drained; waiting (at most {max(0.0, end + args.recovery_grace - time.monotonic()):.0f}s) for "
              f"{len(killer.kills)} recoveries", file=sys.stderr, flush=True)
        recovery = await killer.recovery_s()
        held = await held_after_drain(http, base, args.idle_timeout)
    finally:
        stop.set()
        tasks = [*helpers, *(killer.recoveries if killer is not None else [])]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    notes += _notes(killer, held, reference, monitor)
    recovery = [None if r is None else round(r, 3) for r in recovery]
    lab_part = None
    if lab is not None:
        host_recovery = [r for k, r in zip(killer.kills, recovery) if k.kind in HOST_KINDS]
        lab_part = {"host_faults": [f.as_json() for f in killer.host_faults],
                    "routes": [f.routes for f in killer.host_faults], "recovery_s": host_recovery,
                    "host_roles": {h.name: h.role for h in lab.hosts},
                    "end_s": args.duration + args.request_timeout,  # past the last request's end
                    "duplicates": {name: round(t - t0, 3) for name, t in monitor.duplicates_seen.items()}}
    return build_report(requests, reference, chaos, [k.as_json() for k in killer.kills], recovery,
                        [f.as_json() for f in killer.failures], held, notes, config, lab_part)


async def _remember(launched: Launched) -> None:
    """Record every process under the server as it appears (restarted actors get new workers), so the
    stop can find them by pid even if they leave its tree."""
    while True:
        await asyncio.to_thread(launched.remember)
        await asyncio.sleep(2.0)


def _notes(killer: Killer, held: HeldAfter, reference: list[Record], monitor: HealthMonitor) -> list[str]:
    notes = []
    done = {k.kind for k in killer.kills}
    planned = {k.kind for k in killer.schedule.planned}
    for kind in (*KINDS, *HOST_KINDS):
        if kind in planned and kind not in done:
            why = sorted({f.error for f in killer.failures if f.kind == kind}) or ["the run ended first"]
            notes.append(f"no {kind} kill was done: {'; '.join(why)}")
    if monitor.missing and killer.kills:
        notes.append("recovery_s is null for every kill: the server's readiness cannot be read")
    failed_ref = sum(1 for r in reference if not r.outcome.ok)
    if failed_ref:
        notes.append(f"{failed_ref} request(s) failed in the fault-free run: their chaos-run outputs are not checked")
    if held.unreadable:
        notes.append(f"blocks_held_after unknown: {held.unreadable}")
    elif held.errors:
        notes.append(f"{len(held.errors)} node(s) could not report what they hold after the drain "
                     f"(not counted in blocks_held_after): {held.errors}")
    elif not held.idle:
        notes.append(f"nodes still held requests or blocks {held.waited_s:.0f}s after the drain: {held.per_node}")
    return notes
