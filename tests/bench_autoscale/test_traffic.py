"""The load step's open loop (benchmarks/autoscale/traffic.py) and its requests (workload.py) against
a small aiohttp server on 127.0.0.1 in the test's own event loop: one Record per arrival, with its
phase, status, TTFT, TPOT and end time; the bounded wait, the cancel of what is still open, and the
arrivals the client's bound held back past the window recorded as unsent."""
from __future__ import annotations

import asyncio
import json
import time

from aiohttp import web

from raypd.benchmarks.autoscale.plan import Arrival
from raypd.benchmarks.autoscale.records import UNSENT
from raypd.benchmarks.autoscale.traffic import CANCELLED, OpenLoop
from raypd.benchmarks.autoscale.workload import build_requests
from raypd.benchmarks.serve.datasets import Request
from tests.bench_tenants.fake_server import client_session, serve


def chunk(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}).encode() + b"\n\n"


USAGE = b"data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}).encode() + b"\n\n"


def app(seen: list[dict]) -> web.Application:
    """message 'ok': three chunks, usage and [DONE]; 'hold': one chunk, then nothing; 'full': 429; 'gone': 503."""
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        what = body["messages"][-1]["content"]
        if what in ("full", "gone"):
            return web.json_response({"error": {"message": what}}, status=429 if what == "full" else 503)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(chunk("a"))
        if what == "hold":
            await asyncio.sleep(3600)
        await asyncio.sleep(0.02)
        await resp.write(chunk("b") + chunk("c") + USAGE + b"data: [DONE]\n\n")
        return resp
    a = web.Application()
    a.router.add_post("/v1/chat/completions", chat)
    return a


def say(text: str) -> Request:
    return Request(max_tokens=3, messages=[{"role": "user", "content": text}])


def test_every_arrival_becomes_a_record_with_its_phase_status_latencies_and_end():
    async def run():
        seen: list = []
        async with serve(app(seen)) as base, client_session() as http:
            loop = OpenLoop(http, f"{base}/v1", "m", [say(w) for w in ("ok", "full", "gone", "hold")], timeout_s=30,
                            max_inflight=8)
            t0 = time.perf_counter()
            arrivals = [Arrival(0.0, "warm"), Arrival(0.05, "step"), Arrival(0.1, "step"), Arrival(0.15, "cool")]
            await loop.send_all(arrivals, t0, until_s=5.0)
            began = time.perf_counter()
            await loop.finish(0.5)                         # 'hold' never ends: bounded
            assert 0.4 < time.perf_counter() - began < 5
            assert loop.open_count() == 1 and await loop.cancel_open() == 1
            return seen, loop.records(), loop.late
    seen, (ok, full, gone, held), late = asyncio.run(run())
    assert [b["messages"][-1]["content"] for b in seen] == ["ok", "full", "gone", "hold"]
    assert all(b["stream"] and b["max_tokens"] == 3 and b["ignore_eos"] for b in seen)
    assert (ok.at_s, ok.phase, ok.status, ok.error) == (0.0, "warm", "200", None)
    assert ok.ttft_s is not None and ok.tpot_s is not None and ok.tpot_s > 0       # 3 tokens from the usage
    assert ok.sent_s is not None and ok.end_s is not None and ok.sent_s < ok.end_s
    assert (full.phase, full.status, full.error) == ("step", "429", "http_429")
    assert (gone.status, gone.error) == ("503", "http_503")
    assert (held.phase, held.status, held.error) == ("cool", "exception", CANCELLED)
    assert held.ttft_s is not None and held.end_s is not None                      # its first token kept
    assert late == 0


def test_arrivals_held_back_by_the_client_s_bound_past_the_window_are_recorded_unsent():
    async def run():
        async with serve(app([])) as base, client_session() as http:
            loop = OpenLoop(http, f"{base}/v1", "m", [say("hold")] * 4, timeout_s=30, max_inflight=1)
            arrivals = [Arrival(t, "step") for t in (0.0, 0.0, 0.1, 0.2)]
            await asyncio.wait_for(loop.send_all(arrivals, time.perf_counter(), until_s=0.5), 5)
            assert (loop.late, loop.open_count()) == (1, 1)
            await loop.cancel_open()
            return loop.records()
    records = asyncio.run(run())
    assert [(r.at_s, r.error) for r in records] == [(0.0, CANCELLED), (0.0, UNSENT), (0.1, UNSENT), (0.2, UNSENT)]
    assert all(r.status == "exception" and r.lost for r in records)
    assert records[1].sent_s is None and records[1].end_s is None


def test_the_requests_are_short_chat_messages_the_same_for_the_same_seed():
    reqs = build_requests(5, prompt_words=24, output_len=32, seed=3)
    assert reqs == build_requests(5, prompt_words=24, output_len=32, seed=3)
    assert reqs != build_requests(5, prompt_words=24, output_len=32, seed=4)
    assert len({r.messages[0]["content"] for r in reqs}) == 5                   # type: ignore[index]
    for r in reqs:
        assert r.chat and r.max_tokens == 32 and r.messages[0]["role"] == "user"  # type: ignore[index]
        assert 24 <= len(r.messages[0]["content"].split()) < 80                   # type: ignore[index]
    assert build_requests(0, 24, 32, 0) == []
