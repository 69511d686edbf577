"""Helpers for tests that run node actors on a local Ray cluster."""
from __future__ import annotations

import asyncio
import time

import ray

from cluster.request_driver import RequestDriver
from engine.sampling_params import SamplingParams

# Short timeouts so failure tests end quickly; the nodes must still finish every request in time.
FAST_TRANSFER = {"backend": "nixl", "nixl_ucx_devices": "lo", "bootstrap_timeout_s": 60.0, "wait_timeout_s": 60.0,
                 "transfer_timeout_s": 8.0, "heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 3.0}


async def collect(driver: RequestDriver, rid: str, ids, params: SamplingParams, **route):
    tokens: list[int] = []
    async for chunk in driver.generate(rid, ids, params, **route):
        tokens.extend(chunk.token_ids)
        if chunk.finished:
            return tokens, chunk
    raise AssertionError(f"{rid}: stream ended without a final chunk")


def run_all(driver: RequestDriver, prompts, params: SamplingParams, **route):
    """All prompts at once through the given (or round-robin) nodes: [(tokens, final chunk)]."""
    async def main():
        return await asyncio.gather(*(collect(driver, f"r{i}-{time.monotonic_ns()}", ids, params, **route)
                                      for i, ids in enumerate(prompts)))
    return asyncio.run(main())


def assert_idle(nodes, timeout_s: float = 15.0) -> None:
    """Every node's block accounting adds up and nothing is held: no request, room, reservation,
    stream or aux slot. Waits up to timeout_s for endings still in flight (aborts, heartbeats)."""
    deadline = time.monotonic() + timeout_s
    while True:
        reports = ray.get([n.actor.check_idle.remote() for n in nodes], timeout=30)
        busy = {n.name: r for n, r in zip(nodes, reports) if any(r.values())}
        if not busy:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"nodes still hold state: {busy}")
        time.sleep(0.2)
