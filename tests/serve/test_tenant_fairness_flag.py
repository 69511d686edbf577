"""`raypd serve --no-tenant-fairness`: the one switch that takes tenants out of the ingress's line
and of the nodes' waiting queues (cluster/openai/guard.py stamps every caller with one tenant). Through
the real app, guard and gate, without Ray: with fairness on, a tenant that has been served less goes
ahead of another tenant's earlier requests, and each request reaches the nodes with its own tenant;
with it off, the same requests are served in arrival order and reach the nodes as one tenant's."""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import pytest

from raypd.cluster.cli.main import build_parser
from raypd.cluster.cli.serve import config_from_args
from raypd.cluster.openai.guard import SHARED_TENANT
from raypd.cluster.openai.metrics import IngressMetrics
from raypd.cluster.serve.admission import AdmissionGate
from raypd.cluster.serve.app import build_app
from raypd.cluster.serve.config import ServeConfig, ServeConfigError
from raypd.cluster.serve.generation import Generator
from raypd.cluster.serve.service import OpenAIService
from raypd.protocol.messages import TokenChunk
from tests.fake_metrics import FakeMetricsAPI
from tests.serve.test_admission import post as post_raw
from tests.serve.test_failover import RecordingRouter
from tests.serve.test_ingress_app import LIMITS, MODEL


class HoldingDriver:
    """Records each request as it reaches the nodes (its max_tokens names it, and its tenant) and holds
    it there until the test lets it finish."""

    def __init__(self) -> None:
        self.started: list[tuple[int, str]] = []
        self.holds: list[asyncio.Event] = []

    async def generate(self, request_id, prompt_token_ids, params, prefill, decode=None):
        self.started.append((params.max_tokens, params.tenant))
        hold = asyncio.Event()
        self.holds.append(hold)
        await hold.wait()
        yield TokenChunk(request_id, (42,) * params.max_tokens, finished=True, finish_reason="length")


async def post(app, tenant: str, max_tokens: int) -> int:
    """A completion request of `tenant` (its header) through the app: the status."""
    raw = json.dumps({"model": MODEL, "prompt": "Hello", "max_tokens": max_tokens}).encode()
    return (await post_raw(app, raw, headers=((b"x-raypd-tenant", tenant.encode()),)))[0]


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the app"
        await asyncio.sleep(0.001)


def serve_order(tokenizer, tenant_fairness: bool) -> list[tuple[int, str]]:
    """b1 holds the only slot; b2, b3 (tenant b) and then a1 (tenant a) wait in line; each is let finish
    in turn. The order in which they reach the nodes, as (max_tokens, tenant)."""
    async def run():
        driver = HoldingDriver()
        gate = AdmissionGate(max_ongoing=1, max_queued=8, max_burst=0)
        service = OpenAIService(tokenizer, LIMITS, Generator(driver, RecordingRouter(), tokenizer.hf), [])
        app = build_app(service, api_key=None, max_body_bytes=1 << 20, gate=gate,
                        metrics=IngressMetrics(FakeMetricsAPI()), tenant_fairness=tenant_fairness)
        calls = [asyncio.ensure_future(post(app, "b", 1))]
        await until(lambda: len(driver.started) == 1)
        for i, (tenant, max_tokens) in enumerate([("b", 2), ("b", 3), ("a", 4)]):
            calls.append(asyncio.ensure_future(post(app, tenant, max_tokens)))
            await until(lambda i=i: gate.queued == i + 1)  # in line in this order
        for n in range(4):  # the request now on the nodes ends: the next in line takes its slot
            driver.holds[n].set()
            await until(lambda n=n: len(driver.started) == n + 2 if n < 3 else all(c.done() for c in calls))
        assert await asyncio.gather(*calls) == [200] * 4
        assert (gate.ongoing, gate.queued) == (0, 0)
        return driver.started
    return asyncio.run(run())


def test_with_fairness_a_tenant_served_less_goes_ahead_and_the_nodes_see_each_tenant(tokenizer):
    # b1 ends and charges b its tokens: a (served nothing) goes ahead of b's earlier requests.
    assert serve_order(tokenizer, tenant_fairness=True) == [(1, "b"), (4, "a"), (2, "b"), (3, "b")]


def test_without_fairness_the_same_requests_go_in_arrival_order_as_one_tenant(tokenizer):
    assert serve_order(tokenizer, tenant_fairness=False) == [(1, SHARED_TENANT), (2, SHARED_TENANT),
                                                             (3, SHARED_TENANT), (4, SHARED_TENANT)]


def test_the_flag_reaches_the_serve_config():
    def parsed(*argv: str) -> ServeConfig:
        return config_from_args(build_parser().parse_args(["serve", *argv]))
    assert parsed().tenant_fairness is True
    assert parsed("--no-tenant-fairness").tenant_fairness is False
    assert ServeConfig.from_args({"tenant_fairness": False}).tenant_fairness is False
    with pytest.raises(ServeConfigError, match="tenant_fairness"):
        ServeConfig(tenant_fairness="no")  # type: ignore[arg-type]
