"""The open loop and the capacity probe against the fake endpoint (tests/bench_chaos/conftest.py):
arrivals at their times, 429s told apart from failures, a slot limit that makes arrivals late."""
from __future__ import annotations

import asyncio

import pytest

from raypd.benchmarks.chaos.workload import ChaosRequest
from raypd.benchmarks.soak.capacity import probe_capacity
from raypd.benchmarks.soak.driver import OpenLoop, arrival_times


def req(i: int, text: str = "hello") -> ChaosRequest:
    return ChaosRequest(index=i, endpoint="completion" if i % 2 else "chat", text=text, max_tokens=8,
                        temperature=0.0, top_p=1.0, seed=None)


def client_for(server):
    import openai

    return openai.AsyncOpenAI(base_url=server.v1, api_key="none", max_retries=0, timeout=10)


def test_arrivals_are_seeded_poisson_within_the_duration():
    a = arrival_times(10.0, 100.0, seed=3)
    assert a == arrival_times(10.0, 100.0, seed=3) != arrival_times(10.0, 100.0, seed=4)
    assert all(0 < x < 100.0 for x in a) and a == sorted(a)
    assert 900 < len(a) < 1100  # mean rate 10/s
    with pytest.raises(ValueError):
        arrival_times(0.0, 10.0)


def test_open_loop_sends_at_the_rate_and_counts_429_apart(server):
    requests = [req(0), req(1), req(2, "status 429"), req(3, "status 500")]

    async def go():
        client = client_for(server)
        try:
            return await OpenLoop(client, "fake-model", requests, rate=20.0, timeout_s=10, seed=1).run(1.5)
        finally:
            await client.close()

    out = asyncio.run(go())
    n = len(arrival_times(20.0, 1.5, seed=1))
    assert len(out.records) == n == len(server.bodies) and out.late == 0
    assert [r.start_s for r in out.records] == sorted(r.start_s for r in out.records)
    expected = {0: None, 1: None, 2: "http_429", 3: "http_500"}
    assert {r.index for r in out.records} == set(expected)
    assert all(r.outcome.reason == expected[r.index] for r in out.records)
    assert all(r.cycle == k // 4 for k, r in enumerate(out.records))
    assert out.load_s >= 1.5 and out.drain_s >= 0


def test_arrivals_that_find_every_slot_busy_wait_and_are_counted_late(server):
    async def go():
        client = client_for(server)
        try:
            return await OpenLoop(client, "fake-model", [req(0, "slow")], rate=20.0, timeout_s=10, max_inflight=1,
                                  seed=0).run(0.2)
        finally:
            await client.close()

    out = asyncio.run(go())
    assert len(out.records) == len(arrival_times(20.0, 0.2, seed=0)) == 3 and out.late == 2
    assert all(r.outcome.ok for r in out.records)


def test_capacity_is_completed_requests_per_second(server):
    async def go(requests):
        client = client_for(server)
        try:
            return await probe_capacity(client, "fake-model", requests, concurrency=2, duration_s=0.5, timeout_s=10)
        finally:
            await client.close()

    cap = asyncio.run(go([req(i) for i in range(8)]))
    assert cap.ok > 2 and cap.failed == 0 and cap.rejected == 0 and cap.concurrency == 2
    assert cap.rps == pytest.approx(cap.ok / cap.elapsed_s)
    with pytest.raises(ValueError, match="no request completed"):
        asyncio.run(go([req(i, "status 429") for i in range(4)]))


def test_a_later_phase_starts_at_its_offset_on_the_same_clock(server):
    async def go():
        client = client_for(server)
        try:
            return await OpenLoop(client, "fake-model", [req(0)], rate=20.0, timeout_s=10, seed=1).run(
                0.2, start_at=0.5)
        finally:
            await client.close()

    out = asyncio.run(go())
    assert len(out.records) == len(arrival_times(20.0, 0.2, seed=1)) > 0
    assert all(0.5 <= r.start_s < 0.8 for r in out.records) and 0.2 <= out.load_s < 0.5
