"""The server's capacity on the soak's requests, measured briefly: a closed loop of `concurrency`
workers (benchmarks/chaos/driver.py) for `duration_s`, after a warm-up of one request per worker.
Capacity = requests completed / seconds until the last of them ended (the drain included, so the
work started inside the window is paid for). The soak then offers `load` x that rate.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from raypd.benchmarks.chaos.driver import Load
from raypd.benchmarks.chaos.workload import ChaosRequest
from raypd.benchmarks.soak.latency import is_rejected


@dataclass(frozen=True)
class Capacity:
    rps: float                # completed requests / elapsed
    ok: int
    failed: int
    rejected: int
    elapsed_s: float
    concurrency: int

    def as_json(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


async def probe_capacity(client, model: str, requests: list[ChaosRequest], concurrency: int, duration_s: float,
                         timeout_s: float) -> Capacity:
    """Warm the server up with one request per worker, then measure; ValueError if nothing completed."""
    await Load(client, model, requests[:concurrency], concurrency, timeout_s).once()
    start = time.perf_counter()
    deadline = time.monotonic() + duration_s
    # Start from the warm-up's end of the list, so the probe's prompts are not yet cached.
    records = await Load(client, model, requests[concurrency:] or requests, concurrency, timeout_s).until(deadline)
    elapsed = time.perf_counter() - start
    ok = sum(1 for r in records if r.outcome.ok)
    rejected = sum(1 for r in records if is_rejected(r))
    if ok == 0:
        reasons = sorted({r.outcome.reason or "" for r in records})
        raise ValueError(f"no request completed in the {duration_s:.0f}s capacity probe ({len(records)} sent; "
                         f"{', '.join(reasons) or 'none sent'})")
    return Capacity(ok / elapsed, ok, len(records) - ok - rejected, rejected, elapsed, concurrency)
