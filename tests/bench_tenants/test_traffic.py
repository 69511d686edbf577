"""One stream's open-loop sender (benchmarks/tenants/traffic.py) against a small aiohttp server on
127.0.0.1 in the test's own event loop: each request goes out as its tenant with its priority, at its
arrival time; `finish()` is bounded; `cancel_open()` ends what is still open and keeps the first
token it had; late arrivals are counted when the in-flight bound is reached."""
from __future__ import annotations

import asyncio
import json
import time

from aiohttp import web

from raypd.benchmarks.serve.datasets import Request
from raypd.benchmarks.tenants.phases import Stream
from raypd.benchmarks.tenants.traffic import CANCELLED, StreamSender
from tests.bench_tenants.fake_server import client_session, serve


def chunk(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": None}]}).encode() + b"\n\n"


def app(seen: list[tuple[str | None, dict]]) -> web.Application:
    """prompt 'ok': two chunks and [DONE]; 'hold': one chunk, then nothing; 'full': 429."""
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append((request.headers.get("x-raypd-tenant"), body))
        if body["prompt"] == "full":
            return web.json_response({"error": {"message": "full"}}, status=429)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(chunk("a"))
        if body["prompt"] == "hold":
            await asyncio.sleep(3600)
        await resp.write(chunk("b") + b"data: [DONE]\n\n")
        return resp
    a = web.Application()
    a.router.add_post("/v1/completions", completions)
    return a


def test_a_stream_sends_as_its_tenant_and_the_phase_end_cancels_what_is_open():
    async def run():
        seen: list = []
        async with serve(app(seen)) as base, client_session() as http:
            stream = Stream("a", "tenant-a", -1, 10.0, "fixed", 0)
            reqs = [Request(2, prompt=p) for p in ("ok", "full", "hold")]
            sender = StreamSender(http, f"{base}/v1", "m", stream, reqs, timeout_s=30, max_inflight=8)
            t0 = time.perf_counter()
            await sender.send_all([0.0, 0.05, 0.1], t0, until_s=5.0)
            assert time.perf_counter() - t0 >= 0.1
            began = time.perf_counter()
            await sender.finish(0.5)                       # 'hold' never ends: bounded
            assert 0.4 < time.perf_counter() - began < 5
            assert sender.open_count() == 1 and await sender.cancel_open() == 1
            ok, full, held = sender.results()
            return seen, ok, full, held
    seen, ok, full, held = asyncio.run(run())
    assert [(tenant, body["prompt"], body["priority"]) for tenant, body in seen] == [
        ("tenant-a", "ok", -1), ("tenant-a", "full", -1), ("tenant-a", "hold", -1)]
    assert ok.ok and ok.text == "ab" and ok.ttft_s is not None
    assert full.error == "http_429"
    assert held.error == CANCELLED and held.ttft_s is not None and held.e2e_s is None  # its first token kept


def test_an_arrival_that_finds_every_slot_open_waits_and_is_counted_late():
    async def run():
        async with serve(app([])) as base, client_session() as http:
            stream = Stream("b", "tenant-b", 0, 100.0, "poisson", 0)
            sender = StreamSender(http, f"{base}/v1", "m", stream, [Request(2, prompt="hold")] * 2 +
                                  [Request(2, prompt="ok")], timeout_s=30, max_inflight=2)
            sending = asyncio.ensure_future(sender.send_all([0.0, 0.0, 0.0], time.perf_counter(), until_s=30.0))
            # the sender needs a few loop turns to reach the third arrival; a loaded machine may take long
            for _ in range(200):
                if sender.late or sending.done():
                    break
                await asyncio.sleep(0.05)
            assert not sending.done() and sender.late == 1   # the third waits for a slot
            assert sender.extra == {}                        # priority 0 is the default: not sent
            await sender.cancel_open()                       # frees both slots: the third goes out
            await asyncio.wait_for(sending, 5)
            await sender.finish(5)
            return [r.error for r in sender.results()]
    assert asyncio.run(run()) == [CANCELLED, CANCELLED, None]


def test_arrivals_still_waiting_for_a_slot_when_the_window_ends_are_not_sent():
    async def run():
        async with serve(app([])) as base, client_session() as http:
            stream = Stream("b", "tenant-b", 0, 100.0, "poisson", 0)
            sender = StreamSender(http, f"{base}/v1", "m", stream, [Request(2, prompt="hold")] * 4, timeout_s=30,
                                  max_inflight=1)
            await asyncio.wait_for(sender.send_all([0.0, 0.0, 0.1, 0.2], time.perf_counter(), until_s=0.5), 5)
            assert (sender.late, sender.unsent, sender.open_count()) == (1, 3, 1)
            await sender.cancel_open()
            return len(sender.results())
    assert asyncio.run(run()) == 1
