"""What runs on a started server (benchmarks/autoscale/run.py), against a small aiohttp server on
127.0.0.1 in the test's own event loop that answers /v1/models, streamed chat and /health (no process
is started): the capacity probe, and a load step of well under a second per phase: every arrival
recorded once with its phase, /health sampled from t = 0, the wait for the pool at its minimum."""
from __future__ import annotations

import asyncio
import json

from aiohttp import web

from raypd.benchmarks.autoscale.plan import plan_phases, schedule
from raypd.benchmarks.autoscale.run import RunOptions, calibrate, load_step
from tests.bench_tenants.fake_server import serve

OPTIONS = RunOptions(probe_duration_s=0.5, probe_concurrency=2, prompt_words=8, output_len=4, warmup=1, seed=0,
                     request_timeout_s=10.0, max_inflight=16, drain_timeout_s=5.0, sample_every_s=0.05,
                     settle_timeout_s=5.0)


def chunk(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}).encode() + b"\n\n"


def app(calls: dict[str, int]) -> web.Application:
    """Four tokens a chat answer, 10 ms apart; /health: two live nodes for the first three reads
    (the pool still grown from the warm-up), then one."""
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "tiny"}]})

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert body["model"] == "tiny" and body["stream"]
        calls["chat"] += 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for piece in "abcd":
            await resp.write(chunk(piece))
            await asyncio.sleep(0.01)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def health(request: web.Request) -> web.Response:
        calls["health"] += 1
        nodes = [{"name": f"m{i}", "role": "mixed", "state": "live"} for i in range(2 if calls["health"] <= 3 else 1)]
        return web.json_response({"status": "ok", "nodes": nodes})

    a = web.Application()
    a.router.add_get("/v1/models", models)
    a.router.add_post("/v1/chat/completions", chat)
    a.router.add_get("/health", health)
    return a


def port_of(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


def test_the_capacity_probe_counts_what_completed_per_second():
    async def run():
        calls = {"chat": 0, "health": 0}
        async with serve(app(calls)) as base:
            return await calibrate(OPTIONS, port_of(base)), calls
    capacity, calls = asyncio.run(run())
    assert capacity.completed > 0 and capacity.failed == 0 and capacity.rps > 0 and capacity.concurrency == 2
    assert calls["chat"] >= 1 + 2 + capacity.completed             # the warm-up, the probe's own warm-up, the probe


def test_a_load_step_records_every_arrival_once_and_samples_health_from_t0():
    plan = plan_phases(20.0, 3.0, warm_s=0.3, step_s=0.3, cool_s=0.3, seed=1)

    async def run():
        calls = {"chat": 0, "health": 0}
        async with serve(app(calls)) as base:
            return await load_step(OPTIONS, port_of(base), plan, {"mixed": 1}), calls
    measured, calls = asyncio.run(run())
    arrivals = schedule(plan)
    assert [(r.at_s, r.phase) for r in measured.records] == [(a.at_s, a.phase) for a in arrivals]
    assert all(r.status == "200" and r.ttft_s is not None and r.end_s is not None for r in measured.records)
    assert calls["chat"] == OPTIONS.warmup + len(arrivals)
    assert measured.settle["at_min"] and measured.settle["pool"] == {"mixed": {"live": 1}}
    assert measured.samples and measured.samples[0].t_s < 0.5 and measured.health_unreadable == 0
    assert all(s.roles == {"mixed": {"live": 1}} for s in measured.samples)   # the settle's reads are not in them
    assert (measured.cancelled, measured.late) == (0, 0) and measured.elapsed_s >= plan[-1].end_s
