"""The ingress app without Ray: the statuses that need a cluster to misbehave (429 from the routing
seam, 503 for no node or a node failure before or after the first token) and the abort path when
the client disconnects, driven through the ASGI interface with test doubles at the driver and
router seams (the real ones run in the HTTP tests of this package)."""
from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest

from raypd.cluster.client.node_handles import NodeHandle
from raypd.cluster.client.router import RoundRobinRouter, Route, Router
from raypd.cluster.openai.params import ModelLimits
from raypd.cluster.serve.app import build_app
from raypd.cluster.serve.generation import Generator
from raypd.cluster.serve.service import OpenAIService
from raypd.conductor.errors import AdmissionRejected
from raypd.protocol.messages import HostInfo, TokenChunk
from raypd.protocol.roles import Role

MODEL = "test-model"
LIMITS = ModelLimits(name=MODEL, context_len=8192, vocab_size=49152, block_size=16, decode_kv_tokens=4096,
                     prefill_kv_tokens=4096)
BODY = json.dumps({"model": MODEL, "prompt": "Hello", "max_tokens": 8}).encode()
STREAM_BODY = json.dumps({"model": MODEL, "prompt": "Hello", "max_tokens": 8, "stream": True}).encode()


class ScriptedDriver:
    """Plays fixed chunks for every request and records which streams were closed (= aborted)."""

    def __init__(self, chunks: list[TokenChunk], delay_s: float = 0.0):
        self.chunks = chunks
        self.delay_s = delay_s
        self.closed: list[str] = []

    async def generate(self, request_id, prompt_token_ids, params, prefill, decode=None):
        try:
            for c in self.chunks:
                await asyncio.sleep(self.delay_s)
                yield replace(c, request_id=request_id)
        finally:
            self.closed.append(request_id)


# A node for routers to name; the scripted driver never contacts it.
MIXED_NODE = NodeHandle("raypd-mixed-0", Role.MIXED, None, HostInfo("n0", "127.0.0.1", "localhost", 0), 64)


class AnyRoute(Router):
    async def route(self, request_id, prompt_token_ids, exclude=frozenset(), priority=0):
        return Route(MIXED_NODE)


class RejectingRouter(Router):
    async def route(self, request_id, prompt_token_ids, exclude=frozenset(), priority=0):
        raise AdmissionRejected(request_id, "ttft", 3.0, 1.0)


def app_for(tokenizer, driver, router=None, **generator_options):
    generator = Generator(driver, router or AnyRoute(), tokenizer.hf, **generator_options)
    service = OpenAIService(tokenizer, LIMITS, generator, [])
    return build_app(service, api_key=None, max_body_bytes=1 << 20)


async def call(app, body: bytes, disconnect_on_data: bool = False) -> tuple[int, bytes]:
    """One POST /v1/completions through the ASGI interface; optionally the client disconnects as
    soon as the first SSE event arrives."""
    sent: list[dict] = []
    body_sent = False
    got_data = asyncio.Event()

    async def receive():
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        if disconnect_on_data:
            await got_data.wait()
        else:
            await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
        if message["type"] == "http.response.body" and b"data: " in message.get("body", b""):
            got_data.set()

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 80)}
    await asyncio.wait_for(app(scope, receive, send), 30)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def tokens(tokenizer, text: str) -> tuple[int, ...]:
    return tuple(tokenizer.hf.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("body", [BODY, STREAM_BODY], ids=["json", "stream"])
def test_slo_rejection_is_429(tokenizer, body):
    status, raw = asyncio.run(call(app_for(tokenizer, ScriptedDriver([]), RejectingRouter()), body))
    assert status == 429
    assert json.loads(raw)["error"]["type"] == "rate_limit_error"


@pytest.mark.parametrize("body", [BODY, STREAM_BODY], ids=["json", "stream"])
def test_no_node_is_503(tokenizer, body):
    status, raw = asyncio.run(call(app_for(tokenizer, ScriptedDriver([]), RoundRobinRouter([])), body))
    assert status == 503 and json.loads(raw)["error"]["code"] == "no_node"


@pytest.mark.parametrize("body", [BODY, STREAM_BODY], ids=["json", "stream"])
def test_node_failure_before_output_is_503_once_retries_are_spent(tokenizer, body):
    driver = ScriptedDriver([TokenChunk("", (), finished=True, error="node raypd-decode-0 failed: RayActorError")])
    status, raw = asyncio.run(call(app_for(tokenizer, driver, retry_limit=2), body))
    assert status == 503
    assert "raypd-decode-0" in json.loads(raw)["error"]["message"]
    assert len(driver.closed) == 3  # the first attempt and two retries


def test_node_failure_mid_stream_is_an_error_event_once_replays_are_spent(tokenizer):
    driver = ScriptedDriver([TokenChunk("", tokens(tokenizer, " Paris")),
                             TokenChunk("", (), finished=True, error="no token from node raypd-decode-0 within 120s")])
    status, raw = asyncio.run(call(app_for(tokenizer, driver, migration_limit=0), STREAM_BODY))
    events = [line[6:] for line in raw.decode().split("\n\n") if line.startswith("data: ")]
    assert status == 200
    assert json.loads(events[0])["choices"][0]["text"] == " Paris"
    assert json.loads(events[-2])["error"]["code"] == "node_failure"
    assert events[-1] == "[DONE]"


def test_disconnect_closes_the_driver_stream(tokenizer):
    endless = [TokenChunk("", tokens(tokenizer, " word"))] * 1000
    driver = ScriptedDriver(endless, delay_s=0.01)
    asyncio.run(call(app_for(tokenizer, driver), STREAM_BODY, disconnect_on_data=True))
    assert len(driver.closed) == 1  # the driver's finally ran: it aborts on both nodes


def test_multibyte_characters_are_never_split_in_the_stream(tokenizer):
    ids = tokens(tokenizer, "Weather: ☀️🌧 你好")
    driver = ScriptedDriver([TokenChunk("", (t,)) for t in ids] + [TokenChunk("", (), finished=True,
                                                                              finish_reason="length")])
    _, raw = asyncio.run(call(app_for(tokenizer, driver), STREAM_BODY))
    texts = [json.loads(e[6:])["choices"][0]["text"] for e in raw.decode().split("\n\n")
             if e.startswith("data: {")]
    assert "".join(texts) == "Weather: ☀️🌧 你好"
    assert not any("\ufffd" in t for t in texts)
