"""One request and a concurrent load through the real openai client against the fake endpoint:
text, finish_reason, usage and timings of a good stream, and each failure in its class."""
from __future__ import annotations

import asyncio

import openai
import pytest

from raypd.benchmarks.chaos.client import stream_one
from raypd.benchmarks.chaos.driver import Load
from raypd.benchmarks.chaos.workload import ChaosRequest, build_requests


def _req(text: str, endpoint: str = "completion") -> ChaosRequest:
    return ChaosRequest(0, endpoint, text, max_tokens=5, temperature=0.0, top_p=1.0, seed=None)  # type: ignore[arg-type]


def _one(server, req: ChaosRequest, timeout_s: float = 10.0):
    async def go():
        client = openai.AsyncOpenAI(base_url=server.v1, api_key="none", max_retries=0, timeout=timeout_s)
        try:
            return await stream_one(client, "fake-model", req, timeout_s)
        finally:
            await client.close()
    return asyncio.run(go())


@pytest.mark.parametrize("endpoint", ["chat", "completion"])
def test_a_good_stream(server, endpoint):
    out = _one(server, _req("ok", endpoint))
    assert out.ok, out.detail
    assert out.text == "The [ok] quick brown fox." and out.finish_reason == "length" and out.completion_tokens == 5
    assert 0 < out.ttft_s <= out.e2e_s and out.tpot_s is not None  # type: ignore[operator]
    body = server.bodies[-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True} and "seed" not in body


@pytest.mark.parametrize("text, reason", [("status 503", "http_503"), ("status 429", "http_429"),
                                          ("error_event", "stream_error"), ("drop", "connection"),
                                          ("no_finish", "incomplete")])
def test_failures_are_classified(server, text, reason):
    out = _one(server, _req(text))
    assert not out.ok and out.reason == reason, out.detail


def test_a_request_over_its_timeout(server):
    out = _one(server, _req("slow"), timeout_s=0.3)
    assert out.reason == "timeout"


def test_connection_refused():
    class Gone:
        v1 = "http://127.0.0.1:9/v1"
    out = _one(Gone(), _req("ok"), timeout_s=5)
    assert out.reason == "connection"


def test_load_once_and_until_a_deadline(server):
    requests = build_requests(6, seed=0)
    seen = []

    async def go():
        client = openai.AsyncOpenAI(base_url=server.v1, api_key="none", max_retries=0, timeout=10)
        try:
            load = Load(client, "fake-model", requests, concurrency=3, timeout_s=10, on_record=seen.append)
            once = await load.once()
            import time
            cycled = await load.until(time.monotonic() + 0.5)
            return once, cycled
        finally:
            await client.close()

    once, cycled = asyncio.run(go())
    assert sorted(r.index for r in once) == list(range(6)) and {r.cycle for r in once} == {0}
    assert all(r.outcome.ok for r in once + cycled)
    assert len(cycled) >= 6 and max(r.cycle for r in cycled) >= 1
    assert len(seen) == len(once) + len(cycled)
    seeded = [b for b in server.bodies if b.get("temperature")]
    assert seeded and all("seed" in b for b in seeded)
