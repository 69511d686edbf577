"""The capacity probe of `raypd bench tenants` (benchmarks/tenants/capacity.py) against a small
aiohttp server: completed requests over the probe's time, warm-up left out; a probe that completes
nothing is a typed error naming why."""
from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from raypd.benchmarks.serve.datasets import Request
from raypd.benchmarks.tenants.capacity import PROBE_TENANT, NoCapacity, probe_capacity
from tests.bench_tenants.fake_server import client_session, serve


def app(status: int, seen: list[str]) -> web.Application:
    """Every request takes 50 ms, then is answered `status` (200: one chunk and [DONE])."""
    async def completions(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("x-raypd-tenant", ""))
        await asyncio.sleep(0.05)
        if status != 200:
            return web.json_response({"error": {"message": "full"}}, status=status)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices": [{"index": 0, "text": "x"}]}\n\ndata: [DONE]\n\n')
        return resp
    a = web.Application()
    a.router.add_post("/v1/completions", completions)
    return a


def probe(status: int, seen: list[str]):
    async def run():
        async with serve(app(status, seen)) as base, client_session() as http:
            return await probe_capacity(http, f"{base}/v1", "m", [Request(1, prompt="p")] * 400, concurrency=4,
                                        duration_s=0.5, timeout_s=10)
    return asyncio.run(run())


def test_the_probe_counts_completed_requests_over_its_time():
    seen: list[str] = []
    capacity = probe(200, seen)
    # 4 workers x 1 request / 50 ms: at most 80 req/s; the loaded test machine may do fewer.
    assert 10 < capacity.rps <= 85 and capacity.failed == 0 and capacity.measured
    assert capacity.completed == len(seen) - 4             # the warm-up's 4 are not counted
    assert set(seen) == {PROBE_TENANT}
    assert capacity.as_json()["concurrency"] == 4


def test_a_probe_that_completes_nothing_says_why():
    with pytest.raises(NoCapacity, match="http_429"):
        probe(429, [])
