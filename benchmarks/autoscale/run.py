"""What runs on each started server, between its readiness and its stop:

    calibration server (no autoscaling; skipped with --base-rate):
        warm-up -> capacity probe (tenants' closed loop on this benchmark's requests) -> base rate
                   = --base-load x capacity
    autoscaling server:
        warm-up -> /health ok with the pool at its minimum (waited for, bounded) -> t = 0: the /health
        sampler starts, the open loop sends warm, step and cool's arrivals -> the open requests get
        at most --drain-timeout -> the sampler stops, every request still open is cancelled

The warm-up sends a few requests one at a time so first-use costs stay out of the figures. The wait
for the minimum makes the step start from the pool the run is about (the warm-up or an earlier
order could have grown it); if it does not come within --settle-timeout the run goes on and the
report says what the pool was at t = 0. Every wait is bounded, so the load step lasts at most the
phases + the drain + the cancel.
"""
from __future__ import annotations

import asyncio
import math
import sys
import time
from dataclasses import dataclass, field

import aiohttp

from raypd.benchmarks.autoscale.health import HealthSample, HealthSampler
from raypd.benchmarks.autoscale.plan import Phase, phase_at, schedule
from raypd.benchmarks.autoscale.pool import at_min
from raypd.benchmarks.autoscale.records import Record
from raypd.benchmarks.autoscale.traffic import OpenLoop
from raypd.benchmarks.autoscale.workload import build_requests
from raypd.benchmarks.serve.runner import fetch_model
from raypd.benchmarks.tenants.capacity import Capacity, closed_loop, probe_capacity

WARMUP_SEED = 10_000
PROBE_SEED = 20_000
LOAD_SEED = 30_000


@dataclass(frozen=True)
class RunOptions:
    probe_duration_s: float
    probe_concurrency: int
    prompt_words: int
    output_len: int
    warmup: int
    seed: int
    request_timeout_s: float
    max_inflight: int
    drain_timeout_s: float
    sample_every_s: float
    settle_timeout_s: float


@dataclass
class Measured:
    """What the load step measured, for the report."""
    records: list[Record] = field(default_factory=list)
    samples: list[HealthSample] = field(default_factory=list)
    orders: list[dict] = field(default_factory=list)
    health_unreadable: int = 0
    late: int = 0
    open_after_arrivals: int = 0
    cancelled: int = 0
    elapsed_s: float = 0.0
    settle: dict = field(default_factory=dict)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _http() -> aiohttp.ClientSession:
    # A connection per request, as bench serve's runner: no keep-alive connection closing under a send.
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True),
                                 timeout=aiohttp.ClientTimeout(total=None))


async def _warm_up(o: RunOptions, http: aiohttp.ClientSession, base_url: str, model: str) -> None:
    if o.warmup > 0:
        warm = build_requests(o.warmup, o.prompt_words, o.output_len, o.seed + WARMUP_SEED)
        await closed_loop(http, base_url, model, warm, 1, math.inf, o.request_timeout_s)


async def calibrate(o: RunOptions, port: int) -> Capacity:
    """One node's capacity on this benchmark's requests (NoCapacity if the probe completed nothing)."""
    base_url = f"http://127.0.0.1:{port}/v1"
    model = await fetch_model(base_url)
    async with _http() as http:
        await _warm_up(o, http, base_url, model)
        _log(f"autoscale: capacity probe, {o.probe_concurrency} concurrent requests for {o.probe_duration_s:g}s ...")
        count = o.probe_concurrency + min(4096, max(64, math.ceil(32 * o.probe_duration_s)))
        requests = build_requests(count, o.prompt_words, o.output_len, o.seed + PROBE_SEED)
        capacity = await probe_capacity(http, base_url, model, requests, o.probe_concurrency, o.probe_duration_s,
                                        o.request_timeout_s)
    _log(f"autoscale: capacity {capacity.rps:.3f} req/s ({capacity.completed} completed, {capacity.failed} failed)")
    return capacity


async def settle(sampler: HealthSampler, least: dict[str, int], timeout_s: float) -> dict:
    """Until /health says ok with every role at its minimum, at most timeout_s: {at_min, waited_s, pool}."""
    began = time.perf_counter()
    sample = None
    while True:
        sample = await sampler.read_once() or sample
        if sample is not None and sample.status == "ok" and at_min(sample, least):
            break
        if time.perf_counter() - began > timeout_s:
            break
        await asyncio.sleep(sampler.interval_s)
    ok = sample is not None and sample.status == "ok" and at_min(sample, least)
    return {"at_min": ok, "waited_s": round(time.perf_counter() - began, 2),
            "pool": None if sample is None else sample.roles}


async def load_step(o: RunOptions, port: int, phases: list[Phase], least: dict[str, int]) -> Measured:
    base = f"http://127.0.0.1:{port}"
    model = await fetch_model(f"{base}/v1")
    out = Measured()
    async with _http() as http:
        await _warm_up(o, http, f"{base}/v1", model)
        _log(f"autoscale: waiting for /health ok with {least} live (at most {o.settle_timeout_s:g}s) ...")
        out.settle = await settle(HealthSampler(http, base, time.perf_counter(), o.sample_every_s), least,
                                  o.settle_timeout_s)
        arrivals = schedule(phases)
        requests = build_requests(len(arrivals), o.prompt_words, o.output_len, o.seed + LOAD_SEED)
        total_s = phases[-1].end_s
        _log("autoscale: " + ", ".join(f"{p.name} {p.duration_s:g}s at {p.rate:.3g} req/s" for p in phases)
             + f" ({len(arrivals)} requests)")
        loop = OpenLoop(http, f"{base}/v1", model, requests, o.request_timeout_s, o.max_inflight)
        stop = asyncio.Event()
        t0 = time.perf_counter()
        sampler = HealthSampler(http, base, t0, o.sample_every_s)
        sampling = asyncio.create_task(sampler.run(stop))
        progress = asyncio.create_task(_progress(sampler, loop, phases, t0))
        try:
            await loop.send_all(arrivals, t0, total_s)
            await asyncio.sleep(max(0.0, t0 + total_s - time.perf_counter()))
            out.open_after_arrivals = loop.open_count()
            await loop.finish(o.drain_timeout_s)
            out.elapsed_s = time.perf_counter() - t0
        finally:
            stop.set()
            progress.cancel()
            await asyncio.gather(sampling, progress, return_exceptions=True)
            out.cancelled = await loop.cancel_open()
    out.records, out.late = loop.records(), loop.late
    out.samples, out.orders, out.health_unreadable = sampler.samples, sampler.orders, sampler.unreadable
    return out


async def _progress(sampler: HealthSampler, loop: OpenLoop, phases: list[Phase], t0: float,
                    every_s: float = 15.0) -> None:
    """A line on stderr every every_s: the phase, requests open, the pool as /health last said."""
    while True:
        await asyncio.sleep(every_s)
        t = time.perf_counter() - t0
        phase = phase_at(phases, t) or "drain"
        last = sampler.samples[-1].roles if sampler.samples else {}
        pool = ", ".join(f"{role} " + "/".join(f"{n} {state}" for state, n in states.items())
                         for role, states in last.items()) or "-"
        _log(f"autoscale: t={t:.0f}s {phase}: {loop.open_count()} open; nodes: {pool}")
