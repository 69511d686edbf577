"""One soak between a ready server and its stop, in phases:

    wait for /health/ready -> capacity probe (capacity.py: warm-up, closed loop)
    -> warm-up: open loop at --load x capacity for --warmup s (driver.py)
    -> drain, idle sample 1 -> the measured load: the same rate for the rest of --duration
    -> drain -> blocks held once the nodes are idle (bounded by --idle-timeout) -> idle sample 2
    -> the report (report.py)

Sampling (monitor.py) runs every --sample-every s from the warm-up's start through the last drain;
RSS growth is measured over the measured load's samples (growth.py). An idle sample is taken with no
request anywhere and the phase's openai client closed, so no keep-alive connection is open (the
Serve proxy keeps one for 90 s after its last request, a socket in its descriptor count). Under load a
process's descriptors and threads include those of the requests in flight; at idle they do not, so
the two idle samples, both after the warm-up, tell whether any were left behind.

Requests are the chaos bench's seeded streaming chat / completion list (benchmarks/chaos/
workload.py): the probe's list and the load's list are drawn with different seeds, and the load's
is long enough that no prompt repeats, so the prefix caches keep taking and evicting blocks.
"""
from __future__ import annotations

import asyncio
import math
import sys
import time

import aiohttp

from raypd.benchmarks.chaos.driver import Record
from raypd.benchmarks.chaos.health import HealthMonitor
from raypd.benchmarks.chaos.held_blocks import held_after_drain
from raypd.benchmarks.chaos.workload import build_requests
from raypd.benchmarks.serve.systems import Launched
from raypd.benchmarks.soak.capacity import probe_capacity
from raypd.benchmarks.soak.driver import OpenLoop, OpenLoopResult
from raypd.benchmarks.soak.growth import alive_through
from raypd.benchmarks.soak.latency import is_rejected
from raypd.benchmarks.soak.monitor import Monitor
from raypd.benchmarks.soak.report import build_report
from raypd.benchmarks.soak.sampler import ProcessSampler


async def soak_run(args, launched: Launched, address: str, notes: list[str], config: dict) -> dict:
    """Everything between a ready server and stopping it; the report."""
    base = f"http://127.0.0.1:{launched.port}"
    async with aiohttp.ClientSession() as http:
        return await _run(args, base, http, launched, address, notes, config)


def _client(base: str, timeout_s: float):
    import openai

    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=timeout_s)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class _Tally:
    """A line on stderr per minute of the load: requests so far, ok, failed, rejected."""

    def __init__(self) -> None:
        self.ok = self.failed = self.rejected = 0

    def record(self, rec: Record) -> None:
        if rec.outcome.ok:
            self.ok += 1
        elif is_rejected(rec):
            self.rejected += 1
        else:
            self.failed += 1

    async def every_minute(self, t0: float, duration_s: float) -> None:
        k = 1
        while (k - 1) * 60.0 < duration_s:
            await asyncio.sleep(max(0.0, t0 + min(k * 60.0, duration_s) - time.perf_counter()))
            _log(f"soak: {min(k * 60.0, duration_s):5.0f}s of {duration_s:.0f}s: ok {self.ok}, failed {self.failed}, "
                 f"rejected {self.rejected}")
            k += 1


async def _run(args, base: str, http: aiohttp.ClientSession, launched: Launched, address: str,
               notes: list[str], config: dict) -> dict:
    health = HealthMonitor(http, base)
    if not await health.wait_ready(args.ready_timeout):
        notes.append("the server never reported ready before the capacity probe")
    sampler = ProcessSampler(launched.proc.pid, markers=lambda: [address, sampler.session_dir() or ""])
    monitor = Monitor(sampler, http, base, args.sample_every)
    await monitor.sample(0.0)  # names the node actors and finds the session folder; the load's sampling starts anew
    monitor.reset()
    config["session_dir"] = sampler.session_dir()  # for the stop's check that nothing is left
    launched.remember()
    idle = ProcessSampler(launched.proc.pid, markers=lambda: [address, sampler.session_dir() or ""])
    tokens = (args.min_tokens, args.max_tokens)
    tally = _Tally()
    stop = asyncio.Event()
    helpers: list[asyncio.Task] = []
    client = _client(base, args.request_timeout)
    try:
        model = (await client.models.list()).data[0].id
        _log(f"soak: capacity probe, {args.probe_concurrency} concurrent requests for {args.probe_duration:.0f}s ...")
        probe_list = build_requests(args.probe_concurrency + max(64, math.ceil(args.probe_duration * 8)), args.seed,
                                    tokens)
        capacity = await probe_capacity(client, model, probe_list, args.probe_concurrency, args.probe_duration,
                                        args.request_timeout)
        offered = args.load * capacity.rps
        _log(f"soak: capacity {capacity.rps:.3f} req/s ({capacity.ok} ok, {capacity.failed} failed, "
             f"{capacity.rejected} rejected); offering {offered:.3f} req/s for {args.duration:.0f}s, "
             f"the first {args.warmup:.0f}s a warm-up")
        if capacity.failed or capacity.rejected:
            notes.append(f"the capacity probe had {capacity.failed} failed and {capacity.rejected} rejected request(s)")
        requests = build_requests(max(64, math.ceil(offered * args.duration * 1.3) + 16), args.seed + 1, tokens)

        t0 = time.perf_counter()
        helpers += [asyncio.create_task(monitor.run(t0, stop)),
                    asyncio.create_task(tally.every_minute(t0, args.duration))]
        warm = OpenLoopResult()
        if args.warmup > 0:
            warm = await OpenLoop(client, model, requests, offered, args.request_timeout, args.max_inflight,
                                  args.seed, tally.record).run(args.warmup, t0)
        await client.close()
        await _idle_sample(idle, t0, monitor.names, http, base, args)
        window_start = time.perf_counter() - t0
        _log(f"soak: warm-up done; idle sample taken; the measured load starts at {window_start:.0f}s")
        client = _client(base, args.request_timeout)
        main = await OpenLoop(client, model, requests[len(warm.records):], offered, args.request_timeout,
                              args.max_inflight, args.seed + 1, tally.record).run(args.duration - args.warmup, t0,
                                                                                 start_at=window_start)
        window_end = window_start + main.load_s
        _log(f"soak: drained in {main.drain_s:.1f}s; waiting (at most {args.idle_timeout:.0f}s) for idle nodes")
        held = await held_after_drain(http, base, args.idle_timeout)
        await client.close()
        await _idle_sample(idle, t0, monitor.names, http, base, args)
    finally:
        stop.set()
        for t in helpers:
            t.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        await client.close()
    await monitor.sample(time.perf_counter() - t0)  # for the picture

    load = OpenLoopResult(records=warm.records + main.records, late=warm.late + main.late,
                          load_s=warm.load_s + main.load_s, drain_s=main.drain_s)
    config |= {"window_s": [round(window_start, 2), round(window_end, 2)],
               "idle_sample_s": [round(t, 2) for t in idle.times]}
    if load.late:
        notes.append(f"{load.late} arrival(s) waited for one of the {args.max_inflight} request slots: the server "
                     "fell behind the offered rate")
    if held.unreadable:
        notes.append(f"blocks_held_after unknown: {held.unreadable}")
    elif held.errors:
        notes.append(f"{len(held.errors)} node(s) could not report what they hold after the drain: {held.errors}")
    elif not held.idle:
        notes.append(f"nodes still held requests {held.waited_s:.0f}s after the drain: {held.per_node}")
    series = sampler.labelled()
    late_or_gone = [label for label, s in series.items()
                    if not alive_through(s.t_s, window_start, window_end, args.sample_every)]
    if late_or_gone:
        notes.append(f"processes started after the warm-up or gone before the end (not compared): {late_or_gone}")
    thresholds = {"rss_limit_pct": args.rss_limit_pct, "fds_tolerance": args.fds_tolerance,
                  "threads_tolerance": args.threads_tolerance}
    return build_report(load.records, load, capacity, offered, series, idle, monitor, held, window_start,
                        window_end, args.sample_every, args.tail_samples, thresholds, notes, config)


async def _idle_sample(idle: ProcessSampler, t0: float, names: dict[int, str], http: aiohttp.ClientSession,
                       base: str, args) -> None:
    """Once no node holds a request (bounded) and, the client closed, the server has let go of its
    connections (--idle-settle s), one sample: the idle state descriptors and threads are compared in."""
    await held_after_drain(http, base, args.idle_timeout)
    await asyncio.sleep(args.idle_settle)
    await asyncio.to_thread(idle.sample, time.perf_counter() - t0, dict(names))
