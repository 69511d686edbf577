"""The server's capacity on the benchmark's request shape, measured briefly (as the soak does): a
closed loop of `concurrency` workers, each sending its next request as soon as the last ended, for
`duration_s`, after a warm-up of one request per worker. Capacity = requests completed / seconds
until the last of them ended (the drain included, so work started inside the window is paid for).
A's and B's rates are fractions and multiples of it (main.py's --a-load, --b-load); `--capacity`
gives it instead.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass

import aiohttp

from raypd.benchmarks.serve.client import Result, send
from raypd.benchmarks.serve.datasets import Request
from raypd.cluster.openai.guard import TENANT_HEADER

PROBE_TENANT = "capacity-probe"


class NoCapacity(ValueError):
    """The probe completed nothing: no rate can be derived from it."""


@dataclass(frozen=True)
class Capacity:
    rps: float
    completed: int
    failed: int
    elapsed_s: float
    concurrency: int
    measured: bool = True  # False: given by --capacity

    def as_json(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


async def closed_loop(http: aiohttp.ClientSession, base_url: str, model: str, requests: list[Request],
                      concurrency: int, deadline: float, timeout_s: float) -> list[Result]:
    """Workers take the next request of the list until time.monotonic() passes `deadline` or the list ends."""
    results: list[Result] = []
    queue = iter(requests)
    headers = {TENANT_HEADER.decode(): PROBE_TENANT}
    t0 = time.perf_counter()

    async def worker() -> None:
        while time.monotonic() < deadline and (req := next(queue, None)) is not None:
            results.append(await send(http, base_url, req, model, {}, timeout_s, t0, headers))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


async def probe_capacity(http: aiohttp.ClientSession, base_url: str, model: str, requests: list[Request],
                         concurrency: int, duration_s: float, timeout_s: float) -> Capacity:
    """Warm up with one request per worker, then measure; NoCapacity if nothing completed."""
    if len(requests) <= concurrency:
        raise ValueError("the probe needs more requests than workers")
    await closed_loop(http, base_url, model, requests[:concurrency], concurrency, float("inf"), timeout_s)
    start = time.perf_counter()
    results = await closed_loop(http, base_url, model, requests[concurrency:], concurrency,
                                time.monotonic() + duration_s, timeout_s)
    elapsed = time.perf_counter() - start
    ok = sum(1 for r in results if r.ok)
    if ok == 0:
        reasons = sorted({f"{r.error}: {r.detail[:80]}" for r in results})
        raise NoCapacity(f"no request completed in the {duration_s:g}s capacity probe ({len(results)} sent; "
                         f"{'; '.join(reasons) or 'none sent'})")
    return Capacity(ok / elapsed, ok, len(results) - ok, elapsed, concurrency)
