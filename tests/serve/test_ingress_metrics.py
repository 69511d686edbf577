"""Ingress metrics without Ray: the app driven through ASGI (the doubles of test_ingress_app) with a
fake ray.util.metrics, pinning which status each ending counts as and what the token counters add."""
from __future__ import annotations

import asyncio
import json

import pytest

from raypd.cluster.client.router import RoundRobinRouter
from raypd.cluster.openai.metrics import IngressMetrics, priority_label, status_of
from raypd.cluster.serve.app import build_app
from raypd.cluster.serve.generation import Generator
from raypd.cluster.serve.service import OpenAIService
from raypd.protocol.messages import TokenChunk
from tests.fake_metrics import FakeMetricsAPI
from tests.serve.test_ingress_app import (
    BODY,
    LIMITS,
    MODEL,
    STREAM_BODY,
    AnyRoute,
    RejectingRouter,
    ScriptedDriver,
    call,
    tokens,
)


def app_with_metrics(tokenizer, driver, router=None, api_key=None):
    api = FakeMetricsAPI()
    service = OpenAIService(tokenizer, LIMITS, Generator(driver, router or AnyRoute(), tokenizer.hf), [])
    return build_app(service, api_key=api_key, max_body_bytes=1 << 20, metrics=IngressMetrics(api)), api


def answer(tokenizer, text: str, cached: int = 0) -> list[TokenChunk]:
    """A three-token style answer: its tokens one per chunk, then the final chunk (finish 'length')."""
    ids = tokens(tokenizer, text)
    return [TokenChunk("", (t,)) for t in ids] + [TokenChunk("", (), finished=True, finish_reason="length",
                                                             num_cached_tokens=cached)]


def requests_by_status(api) -> dict[str, float]:
    m = api["raypd_ingress_requests"]
    return {dict(k)["status"]: v for k, v in m.values.items()}


@pytest.mark.parametrize("body", [BODY, STREAM_BODY], ids=["json", "stream"])
def test_ok_request_records_latencies_and_usage_tokens(tokenizer, body):
    app, api = app_with_metrics(tokenizer, ScriptedDriver(answer(tokenizer, " Paris is big", cached=16)))
    status, raw = asyncio.run(call(app, body))
    assert status == 200
    assert requests_by_status(api) == {"ok": 1}
    assert api["raypd_ingress_requests"].value(endpoint="completions", status="ok") == 1
    assert len(api["raypd_ingress_ttft_seconds"].observed(endpoint="completions")) == 1
    assert len(api["raypd_ingress_e2e_latency_seconds"].observed()) == 1
    assert len(api["raypd_ingress_tpot_seconds"].observed()) == 1  # one choice with more than one token
    n_tokens = len(tokens(tokenizer, " Paris is big"))
    assert api["raypd_ingress_completion_tokens"].value() == n_tokens
    assert api["raypd_ingress_prompt_tokens"].value() == len(tokenizer.encode("Hello"))
    assert api["raypd_ingress_cached_tokens"].value() == 16
    if body == BODY:  # the counters agree with the usage the client got
        usage = json.loads(raw)["usage"]
        assert usage["completion_tokens"] == n_tokens and usage["prompt_tokens"] == len(tokenizer.encode("Hello"))


def test_n_choices_count_a_ttft_each_and_cached_tokens_once_per_prompt(tokenizer):
    app, api = app_with_metrics(tokenizer, ScriptedDriver(answer(tokenizer, " Paris", cached=16)))
    body = json.dumps({"model": MODEL, "prompt": "Hello", "max_tokens": 8, "n": 2}).encode()
    assert asyncio.run(call(app, body))[0] == 200
    assert len(api["raypd_ingress_ttft_seconds"].observed()) == 2
    assert api["raypd_ingress_cached_tokens"].value() == 16  # as usage.cached_tokens: the prompt's best choice
    assert api["raypd_ingress_completion_tokens"].value() == 2 * len(tokens(tokenizer, " Paris"))
    assert requests_by_status(api) == {"ok": 1}


def test_echo_is_not_the_first_token(tokenizer):
    # The echoed prompt goes out, then the node fails before generating anything: no TTFT to record.
    driver = ScriptedDriver([TokenChunk("", (), finished=True, error="node raypd-decode-0 failed")])
    app, api = app_with_metrics(tokenizer, driver)
    body = json.dumps({"model": MODEL, "prompt": "Hello", "max_tokens": 8, "echo": True, "stream": True}).encode()
    status, raw = asyncio.run(call(app, body))
    assert status == 200 and "Hello" in raw.decode()  # the echo was the first event of the stream
    assert api["raypd_ingress_ttft_seconds"].observed() == []
    assert requests_by_status(api) == {"unavailable": 1}


@pytest.mark.parametrize("body", [BODY, STREAM_BODY], ids=["json", "stream"])
def test_slo_rejection_counts_as_rejected(tokenizer, body):
    app, api = app_with_metrics(tokenizer, ScriptedDriver([]), RejectingRouter())
    assert asyncio.run(call(app, body))[0] == 429
    assert requests_by_status(api) == {"rejected": 1}
    assert api["raypd_ingress_ttft_seconds"].observed() == []
    assert api["raypd_ingress_e2e_latency_seconds"].observed() == []


@pytest.mark.parametrize("body", [BODY, STREAM_BODY], ids=["json", "stream"])
def test_no_node_counts_as_unavailable(tokenizer, body):
    app, api = app_with_metrics(tokenizer, ScriptedDriver([]), RoundRobinRouter([]))
    assert asyncio.run(call(app, body))[0] == 503
    assert requests_by_status(api) == {"unavailable": 1}


def test_failure_mid_stream_is_unavailable_although_the_status_was_200(tokenizer):
    driver = ScriptedDriver([TokenChunk("", tokens(tokenizer, " Paris")),
                             TokenChunk("", (), finished=True, error="no token from node raypd-decode-0")])
    app, api = app_with_metrics(tokenizer, driver)
    assert asyncio.run(call(app, STREAM_BODY))[0] == 200
    assert requests_by_status(api) == {"unavailable": 1}
    assert len(api["raypd_ingress_ttft_seconds"].observed()) == 1  # the first text did arrive


def test_client_disconnect_counts_as_aborted(tokenizer):
    driver = ScriptedDriver([TokenChunk("", tokens(tokenizer, " word"))] * 1000, delay_s=0.01)
    app, api = app_with_metrics(tokenizer, driver)
    asyncio.run(call(app, STREAM_BODY, disconnect_on_data=True))
    assert requests_by_status(api) == {"aborted": 1}
    assert api["raypd_ingress_e2e_latency_seconds"].observed() == []


def test_requests_and_ttft_by_priority_in_a_bounded_set_of_labels(tokenizer):
    app, api = app_with_metrics(tokenizer, ScriptedDriver(answer(tokenizer, " Paris")), router=RejectingRouter())
    app_ok, api_ok = app_with_metrics(tokenizer, ScriptedDriver(answer(tokenizer, " Paris")))

    def body(priority=None) -> bytes:
        extra = {} if priority is None else {"priority": priority}
        return json.dumps({"model": MODEL, "prompt": "Hello", "max_tokens": 4, **extra}).encode()

    for b in (body(-3), body(), body(), body(2**31 - 1)):
        assert asyncio.run(call(app_ok, b))[0] == 200
    assert asyncio.run(call(app, body(-3)))[0] == 429     # reached generation, refused by the router
    assert asyncio.run(call(app, b"{not json"))[0] == 400  # never reached it: no priority to count
    assert api_ok["raypd_ingress_priority_requests"].value(priority="-3", status="ok") == 1
    assert api_ok["raypd_ingress_priority_requests"].value(priority="0", status="ok") == 2
    assert api_ok["raypd_ingress_priority_requests"].value(priority=">10", status="ok") == 1
    assert [len(api_ok["raypd_ingress_priority_ttft_seconds"].observed(priority=p)) for p in ("-3", "0", ">10")] \
        == [1, 2, 1]
    assert {dict(k)["status"]: v for k, v in api["raypd_ingress_priority_requests"].values.items()} == {"rejected": 1}
    assert [priority_label(p) for p in (-11, -10, 0, 10, 11)] == ["<-10", "-10", "0", "10", ">10"]


@pytest.mark.parametrize("body,api_key,status", [
    (b"{not json", None, 400),
    (json.dumps({"model": "other", "prompt": "x"}).encode(), None, 400),
    (BODY, "secret", 401),  # refused by the guard, before any route runs
], ids=["malformed", "unknown-model", "no-key"])
def test_refused_requests_count_as_client_errors(tokenizer, body, api_key, status):
    app, api = app_with_metrics(tokenizer, ScriptedDriver([]), api_key=api_key)
    assert asyncio.run(call(app, body))[0] == status
    assert requests_by_status(api) == {"client_error": 1}
    assert api["raypd_ingress_prompt_tokens"].values == {}  # nothing reached the generation


@pytest.mark.parametrize("code,expected", [(200, "ok"), (400, "client_error"), (401, "client_error"),
                                           (413, "client_error"), (429, "rejected"), (503, "unavailable"),
                                           (500, "error")])
def test_status_of(code, expected):
    assert status_of(code) == expected


def test_without_ray_nothing_is_recorded(tokenizer):
    assert not IngressMetrics().enabled  # ray is not initialized in unit tests
    rec = IngressMetrics().start("chat")
    rec.finish("ok")
    assert rec.status == "ok"


def test_the_real_ray_metric_classes_accept_the_declarations():
    """Ray's constructors validate names, boundaries and tag keys even before ray.init."""
    from ray.util import metrics

    m = IngressMetrics(metrics)
    assert m.enabled
