"""What runs on each started server, between its readiness and its stop:

    server with tenant fairness:   warm-up -> capacity probe (unless --capacity) -> the plan (phases.py,
                                   rates from the capacity) -> a_alone -> flood_fair -> priority
    server without (--no-tenant-fairness):   warm-up -> flood_unfair

The warm-up sends a few requests one at a time so first-use costs (kernel builds, caches) stay out of
every figure; both servers get it. `Run` carries what the first server measured to the second.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field

import aiohttp

from raypd.benchmarks.serve.datasets import Request, TextSource
from raypd.benchmarks.serve.runner import fetch_model
from raypd.benchmarks.tenants.capacity import Capacity, closed_loop, probe_capacity
from raypd.benchmarks.tenants.phase_run import PhaseSettings, run_phase
from raypd.benchmarks.tenants.phases import Arrivals, Phase, plan_phases, request_seed
from raypd.benchmarks.tenants.workload import build_requests

WARMUP_SEED = 10_000
PROBE_SEED = 20_000


@dataclass(frozen=True)
class RunOptions:
    capacity_rps: float | None   # given: no probe
    probe_duration_s: float
    probe_concurrency: int
    a_load: float
    b_load: float
    a_arrivals: Arrivals
    lead_s: float
    input_len: int
    output_len: int
    warmup: int
    seed: int
    settings: PhaseSettings


@dataclass
class Run:
    """Carried from the first server to the second, and into the report."""
    options: RunOptions
    src: TextSource
    capacity: Capacity | None = None
    plan: list[Phase] = field(default_factory=list)
    phases: dict[str, dict] = field(default_factory=dict)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _http() -> aiohttp.ClientSession:
    # A connection per request, as bench serve's runner: no keep-alive connection closing under a send.
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True),
                                 timeout=aiohttp.ClientTimeout(total=None))


async def on_server(run: Run, port: int, fairness: bool) -> None:
    """The warm-up and this server's phases (the capacity and the plan first, on the first server)."""
    o = run.options
    base = f"http://127.0.0.1:{port}"
    model = await fetch_model(f"{base}/v1")
    async with _http() as http:
        if o.warmup > 0:
            warm = build_requests(run.src, o.warmup, o.input_len, o.output_len, o.seed + WARMUP_SEED)
            await closed_loop(http, f"{base}/v1", model, warm, 1, math.inf, o.settings.request_timeout_s)
        if not run.plan:
            run.capacity = await _capacity(run, http, f"{base}/v1", model)
            run.plan = plan_phases(o.a_load * run.capacity.rps, o.b_load * run.capacity.rps, o.settings.duration_s,
                                   o.lead_s, o.a_arrivals, o.seed)
        for phase in [p for p in run.plan if p.fairness == fairness]:
            requests = _requests(run, phase)
            _log(f"tenants: phase {phase.name} ({'with' if fairness else 'without'} tenant fairness): "
                 + ", ".join(f"{s.name} {len(requests[s.name])} requests at {s.rate:.3g}/s" for s in phase.streams))
            figures = await run_phase(http, base, model, phase, requests, o.settings)
            run.phases[phase.name] = figures
            a, goodput = figures["streams"]["a"], figures["total"]["goodput_rps"]
            _log(f"tenants: {phase.name}: A's TTFT p50/p99 {_s(a['ttft_p50_s'])}/{_s(a['ttft_p99_s'])} s, "
                 f"{a['completed']}/{a['requests']} completed; total goodput {goodput:.3g} req/s")


async def _capacity(run: Run, http: aiohttp.ClientSession, base_url: str, model: str) -> Capacity:
    o = run.options
    if o.capacity_rps is not None:
        return Capacity(o.capacity_rps, 0, 0, 0.0, 0, measured=False)
    _log(f"tenants: capacity probe, {o.probe_concurrency} concurrent requests for {o.probe_duration_s:g}s ...")
    count = o.probe_concurrency + min(4096, max(64, math.ceil(32 * o.probe_duration_s)))
    requests = build_requests(run.src, count, o.input_len, o.output_len, o.seed + PROBE_SEED)
    capacity = await probe_capacity(http, base_url, model, requests, o.probe_concurrency, o.probe_duration_s,
                                    o.settings.request_timeout_s)
    _log(f"tenants: capacity {capacity.rps:.3f} req/s ({capacity.completed} completed, {capacity.failed} failed)")
    return capacity


def _requests(run: Run, phase: Phase) -> dict[str, list[Request]]:
    o = run.options
    return {s.name: build_requests(run.src, len(s.arrival_times(o.settings.duration_s)), o.input_len, o.output_len,
                                   request_seed(phase, s)) for s in phase.streams}


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"
