"""One phase on a ready server, from its first request to idle nodes:

    t = 0              B's arrivals start (flood phases), the step sampler starts
    t = lead           A's arrivals start (phases.py)
    t = duration       no more arrivals
    A's open requests finish, at most `drain_timeout_s` more (B's open requests keep loading the
                       server meanwhile); elapsed = now - t0, the goodput's denominator
    every request still open is cancelled (a flood's backlog would take minutes to drain)
    the nodes are idle, waited for at most `idle_timeout_s`: what they held at the phase's end (when
                       not idle) and still hold after the wait are reported

Every wait is bounded, so a phase lasts at most duration + drain_timeout + the cancel + idle_timeout.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

from raypd.benchmarks.chaos.held_blocks import held_after_drain, read_held
from raypd.benchmarks.serve.datasets import Request
from raypd.benchmarks.serve.metrics import SLO
from raypd.benchmarks.tenants.figures import stream_figures, total_figures
from raypd.benchmarks.tenants.phases import Phase
from raypd.benchmarks.tenants.step_times import StepSampler
from raypd.benchmarks.tenants.traffic import StreamSender


@dataclass(frozen=True)
class PhaseSettings:
    duration_s: float
    drain_timeout_s: float
    request_timeout_s: float
    max_inflight: int
    sample_every_s: float
    idle_timeout_s: float
    slo: SLO


async def run_phase(http: aiohttp.ClientSession, base: str, model: str, phase: Phase,
                    requests: dict[str, list[Request]], settings: PhaseSettings) -> dict:
    """The phase's figures: per stream and in total, its nodes' step times, what they held after."""
    senders = {s.name: StreamSender(http, f"{base}/v1", model, s, requests[s.name], settings.request_timeout_s,
                                    settings.max_inflight) for s in phase.streams}
    sampler = StepSampler(http, base, settings.sample_every_s)
    stop = asyncio.Event()
    sampling = asyncio.create_task(sampler.run(stop))
    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(senders[s.name].send_all(s.arrival_times(settings.duration_s), t0, settings.duration_s)
                               for s in phase.streams))
        await asyncio.sleep(max(0.0, t0 + settings.duration_s - time.perf_counter()))
        a_open = senders["a"].open_count()
        await senders["a"].finish(settings.drain_timeout_s)
        elapsed = time.perf_counter() - t0
        stop.set()
        await asyncio.wait_for(sampling, settings.sample_every_s + 15)  # its last read ends the steps' window
    finally:
        stop.set()
        sampling.cancel()
        cancelled = {name: await s.cancel_open() for name, s in senders.items()}
    at_end = await read_held(http, base)  # what the cancelled requests still held, if anything
    held = at_end if at_end.idle else await held_after_drain(http, base, settings.idle_timeout_s)
    streams = {}
    for s in phase.streams:
        figures = stream_figures(senders[s.name].results(), settings.slo, elapsed)
        streams[s.name] = {"tenant": s.tenant, "priority": s.priority, "rate": s.rate, "arrivals": s.arrivals,
                           "start_s": s.start_s, "late": senders[s.name].late, "unsent": senders[s.name].unsent,
                           "open_at_phase_end": cancelled[s.name], **figures}
    held_at_end = None if at_end.idle else {"total": at_end.total, "per_node": at_end.per_node}
    return {"fairness": phase.fairness, "elapsed_s": elapsed, "a_open_after_arrivals": a_open,
            "streams": streams, "total": total_figures(streams, elapsed), "step_times": sampler.summary(),
            "step_reads_failed": sampler.unreadable,
            "held_after": {"total": held.total, "idle": held.idle, "waited_s": round(held.waited_s, 2),
                           "per_node": held.per_node, "errors": held.errors, "unreadable": held.unreadable,
                           "at_phase_end": held_at_end}}
