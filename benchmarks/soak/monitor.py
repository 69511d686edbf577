"""The sampling loop: every `period_s`, the server's processes (sampler.py, read in a thread: psutil
blocks) and the nodes' blocks in use and held counts (`GET /admin/nodes`, benchmarks/chaos/
held_blocks.py). Node actors are named by the pids the server reports.
"""
from __future__ import annotations

import asyncio
import time

import aiohttp

from raypd.benchmarks.chaos.held_blocks import read_held
from raypd.benchmarks.soak.sampler import ProcessSampler


class Monitor:
    def __init__(self, sampler: ProcessSampler, http: aiohttp.ClientSession, base: str, period_s: float):
        self.sampler = sampler
        self.http = http
        self.base = base
        self.period_s = period_s
        self.names: dict[int, str] = {}            # pid -> node actor name
        self.node_t_s: list[float] = []
        self.blocks_in_use: list[dict[str, int]] = []  # per node sample: node name -> blocks in use
        self.held: list[int] = []                   # per node sample: the sum of the nodes' held counts
        self.node_errors = 0                        # node samples that could not be read

    async def sample(self, t_s: float) -> None:
        held = await read_held(self.http, self.base, timeout_s=max(5.0, self.period_s))
        if held.unreadable is None:
            self.names.update({pid: name for name, pid in held.pids.items()})
            self.node_t_s.append(t_s)
            self.blocks_in_use.append(dict(held.blocks_in_use))
            self.held.append(held.total)
        else:
            self.node_errors += 1
        await asyncio.to_thread(self.sampler.sample, t_s, dict(self.names))

    def reset(self) -> None:
        """Forget every sample so far (the load's samples start anew); pid names stay."""
        self.sampler.reset()
        self.node_t_s.clear()
        self.blocks_in_use.clear()
        self.held.clear()
        self.node_errors = 0

    async def run(self, t0: float, stop: asyncio.Event) -> None:
        """Sample at t0, t0 + period, ... (time.perf_counter()) until `stop` is set; times are from t0."""
        k = 0
        while not stop.is_set():
            await self.sample(time.perf_counter() - t0)
            k += 1
            try:
                await asyncio.wait_for(stop.wait(), max(0.0, t0 + k * self.period_s - time.perf_counter()))
            except asyncio.TimeoutError:
                pass
