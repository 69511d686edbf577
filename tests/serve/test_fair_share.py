"""Tenant fairness at the ingress's line (protocol/fair_share.py, cluster/serve/admission.py),
without Ray: Virtual Token Counters (charged by tokens served, over the tenant's weight; a returning
tenant lifted to the line's smallest counter, so idle time banks nothing), the line's order between
two tenants, a flood that cannot keep another tenant out of a full line, the `x-raypd-tenant`
header, and a tenant's share in the real app charged with the tokens its response used."""
from __future__ import annotations

import asyncio
import json

import pytest

from raypd.cluster.openai.api_errors import RateLimited
from raypd.cluster.openai.api_keys import Caller, KeyRing
from raypd.cluster.openai.guard import CALLER_KEY, GuardMiddleware
from raypd.cluster.serve.admission import AdmissionGate
from raypd.protocol import fair_share
from raypd.protocol.fair_share import TenantShares


def test_counters_charge_tokens_over_weight_and_lift_a_returning_tenant():
    shares = TenantShares()
    shares.charge("a", 300, 1.0, [])
    shares.charge("b", 300, 3.0, [])
    assert (shares.counter("a"), shares.counter("b")) == (300.0, 100.0)
    shares.charge("b", 0, 1.0, [])                  # a request that served nothing still costs a token
    assert shares.counter("b") == 101.0
    shares.start_waiting("c", ["a", "b"])           # new: lifted to the smallest counter waiting
    assert shares.counter("c") == 101.0
    shares.start_waiting("b", ["a", "c"])           # already at the floor: unchanged
    shares.start_waiting("a", ["b"])                # above it: never lowered
    assert (shares.counter("a"), shares.counter("b")) == (300.0, 101.0)
    shares.start_waiting("d", [])                   # nobody waits: nothing to lift to
    assert shares.counter("d") == 0.0


def test_idle_tenants_are_forgotten_past_the_bound(monkeypatch):
    monkeypatch.setattr(fair_share, "MAX_TENANTS", 3)
    shares = TenantShares()
    for t, tokens in [("a", 5), ("b", 50), ("c", 10), ("busy", 20)]:
        shares.charge(t, tokens, 1.0, ["busy"])
    assert set(shares.counters) == {"b", "busy"}    # at or below the waiting floor (20): lifted anyway


def test_a_tenant_served_less_goes_first_within_a_priority():
    async def run():
        gate = AdmissionGate(max_ongoing=1, max_queued=8, max_burst=0)
        await gate.acquire(0, "b")
        order: list[str] = []

        async def wait(name: str, tenant: str, priority: int = 0):
            await gate.acquire(priority, tenant)
            order.append(name)
        calls = [asyncio.ensure_future(wait(n, t)) for n, t in [("b2", "b"), ("b3", "b"), ("b4", "b"), ("a1", "a"),
                                                                 ("a2", "a")]]
        urgent_b = asyncio.ensure_future(wait("b-urgent", "b", -1))
        await asyncio.sleep(0)
        served = {"b": 400, "a": 100}
        for _ in range(len(calls) + 1):
            tenant = "b" if not order else order[-1][0]
            gate.release(tenant, served[tenant])
            await asyncio.sleep(0)
        await asyncio.gather(*calls, urgent_b)
        return order
    # Priority first; then a's two requests (a was lifted to b's 0 and has been served 200 tokens by
    # the end) before b's, which the 800 tokens served to b put behind.
    assert asyncio.run(run()) == ["b-urgent", "a1", "a2", "b2", "b3", "b4"]


def test_a_flood_cannot_keep_another_tenant_out_of_a_full_line():
    async def run():
        gate = AdmissionGate(max_ongoing=1, max_queued=2, max_burst=0)
        await gate.acquire(0, "flood")
        flood = [asyncio.ensure_future(gate.acquire(0, "flood")) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(RateLimited):            # the flood's own newcomer is refused
            await gate.acquire(0, "flood")
        other = asyncio.ensure_future(gate.acquire(0, "interactive"))  # displaces the flood's newest
        await asyncio.sleep(0)
        with pytest.raises(RateLimited) as e:
            await flood[1]
        assert "tenant served less" in str(e.value)
        gate.release("flood", 500)
        await other                                  # ahead of the flood's older waiter
        assert not flood[0].done()
        gate.release("interactive", 20)
        await flood[0]
        gate.release("flood", 500)
        assert (gate.ongoing, gate.queued, gate.num_displaced) == (0, 0, 1)
    asyncio.run(run())


def caller_after_guard(headers: list[tuple[bytes, bytes]], keys: KeyRing | None = None) -> tuple[int, Caller | None]:
    seen: list[Caller] = []
    sent: list[dict] = []

    async def app(scope, receive, send):
        seen.append(scope["state"][CALLER_KEY])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)
    scope = {"type": "http", "method": "GET", "path": "/v1/models", "headers": headers}
    asyncio.run(GuardMiddleware(app, keys, 1 << 20)(scope, receive, send))
    return next(m["status"] for m in sent if m["type"] == "http.response.start"), (seen or [None])[0]


def test_the_tenant_header_names_the_tenant_and_keeps_the_keys_priority_and_weight(tmp_path):
    path = tmp_path / "keys.yaml"
    path.write_text("keys:\n  - {key: sk-gw, tenant: gateway, priority: 3, weight: 2}\n")
    keys = KeyRing.from_file(path)
    auth = (b"authorization", b"Bearer sk-gw")
    assert caller_after_guard([auth], keys) == (200, Caller("gateway", 3, 2.0))
    assert caller_after_guard([auth, (b"x-raypd-tenant", b"user-42")], keys) == (200, Caller("user-42", 3, 2.0))
    assert caller_after_guard([(b"x-raypd-tenant", b"user-42")]) == (200, Caller("user-42"))
    assert caller_after_guard([(b"x-raypd-tenant", b"two words")])[0] == 400
    assert caller_after_guard([(b"x-raypd-tenant", b"x" * 65)])[0] == 400


def test_the_app_charges_a_tenant_the_tokens_its_response_used(tokenizer):
    from raypd.cluster.openai.metrics import IngressMetrics
    from raypd.cluster.serve.app import build_app
    from raypd.cluster.serve.generation import Generator
    from raypd.cluster.serve.service import OpenAIService
    from raypd.protocol.messages import TokenChunk
    from tests.fake_metrics import FakeMetricsAPI
    from tests.serve.test_admission import post
    from tests.serve.test_failover import RecordingRouter
    from tests.serve.test_ingress_app import LIMITS, MODEL, ScriptedDriver, tokens

    gate = AdmissionGate(max_ongoing=1, max_queued=1, max_burst=0)
    answer = tokens(tokenizer, " Paris is big")
    driver = ScriptedDriver([TokenChunk("", answer), TokenChunk("", (), finished=True, finish_reason="length")])
    service = OpenAIService(tokenizer, LIMITS, Generator(driver, RecordingRouter(), tokenizer.hf), [])
    app = build_app(service, api_key=None, max_body_bytes=1 << 20, gate=gate, metrics=IngressMetrics(FakeMetricsAPI()))
    raw = json.dumps({"model": MODEL, "prompt": "Hello", "max_tokens": 8}).encode()
    assert asyncio.run(post(app, raw))[0] == 200
    assert gate.shares.counter("anonymous") == len(tokenizer.encode("Hello")) + len(answer)
