"""Helpers for tests that run node actors on a local Ray cluster."""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import psutil
import ray

from raypd.cluster.client.request_driver import RequestDriver
from raypd.cluster.client.router import Router
from raypd.protocol.sampling_params import SamplingParams

# Short timeouts so failure tests end quickly; the nodes must still finish every request in time.
FAST_TRANSFER = {"backend": "nixl", "bootstrap_timeout_s": 60.0, "wait_timeout_s": 60.0,
                 "transfer_timeout_s": 8.0, "heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 3.0}


async def collect(driver: RequestDriver, rid: str, ids, params: SamplingParams, **route):
    tokens: list[int] = []
    async for chunk in driver.generate(rid, ids, params, **route):
        tokens.extend(chunk.token_ids)
        if chunk.finished:
            return tokens, chunk
    raise AssertionError(f"{rid}: stream ended without a final chunk")


def run_all(driver: RequestDriver, prompts, params: SamplingParams, router: Router | None = None, **route):
    """All prompts at once through the given nodes (prefill=, decode=), or each through the nodes
    `router` chooses: [(tokens, final chunk)]."""
    async def one(rid: str, ids):
        if router is None:
            return await collect(driver, rid, ids, params, **route)
        chosen = await router.route(rid, ids)
        return await collect(driver, rid, ids, params, prefill=chosen.prefill, decode=chosen.decode)

    async def main():
        return await asyncio.gather(*(one(f"r{i}-{time.monotonic_ns()}", ids) for i, ids in enumerate(prompts)))
    return asyncio.run(main())


def kill_and_wait_dead(cluster, victim, within_s: float) -> None:
    """SIGKILL a node actor (ray.kill), forget it, and wait until the Conductor has marked it dead
    (its heartbeat timeout), at most within_s seconds."""
    ray.kill(victim.actor)
    cluster.remove(victim)
    deadline = time.monotonic() + within_s
    while ray.get(cluster.conductor.status.remote(), timeout=30)["nodes"][victim.name]["alive"]:
        assert time.monotonic() < deadline, f"the Conductor still thinks the killed node {victim.name} is alive"
        time.sleep(0.2)


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


def wait_for(predicate, what: str, timeout_s: float = 30.0, period_s: float = 0.005):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(period_s)


def queues(n) -> dict:
    return ray.get(n.actor.stats.remote(), timeout=30)["queues"]


def held(n) -> int:
    """Requests a prefill node holds in any stage: one without a destination waits for it in BOOTSTRAP,
    or (early admission, the default) is computed with its write armed until the destination comes."""
    q = queues(n)
    return q["bootstrap"] + q["queued"] + q["inflight"]


def process_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@contextlib.contextmanager
def paused(n):
    """Freeze a node's process (SIGSTOP) so it neither acknowledges KV nor answers; always resumed."""
    os.kill(n.host.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(n.host.pid, signal.SIGCONT)
