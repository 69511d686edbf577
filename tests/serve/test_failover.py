"""Retries before the first token and mid-stream replays, through the ingress app without Ray: a
driver double plays one script per attempt and records what each attempt was asked to do; the
routers record what they were told to avoid. (The same paths with real nodes dying run in
tests/cluster/test_fault_tolerance.py.)"""
from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest

from raypd.cluster.client.breaker import CircuitBreaker
from raypd.cluster.client.router import NoNodeError, Route, Router
from raypd.protocol.messages import TokenChunk
from tests.serve.test_ingress_app import MIXED_NODE, MODEL, app_for, call, tokens

DECODE_DIED = TokenChunk("", (), finished=True, error="node raypd-decode-0 failed: ActorDiedError",
                         failed_node="raypd-decode-0")


class AttemptDriver:
    """Plays scripts[i] for the i-th attempt; records (request id, prompt, params) per attempt."""

    def __init__(self, scripts: list[list[TokenChunk]]):
        self.scripts = scripts
        self.attempts: list[tuple[str, list[int], object]] = []

    async def generate(self, request_id, prompt_token_ids, params, prefill, decode=None):
        script = self.scripts[len(self.attempts)]
        self.attempts.append((request_id, list(prompt_token_ids), params))
        for c in script:
            await asyncio.sleep(0)
            yield replace(c, request_id=request_id)


class RecordingRouter(Router):
    def __init__(self):
        self.excluded: list[frozenset[str]] = []

    async def route(self, request_id, prompt_token_ids, exclude=frozenset(), priority=0):
        self.excluded.append(exclude)
        return Route(MIXED_NODE)


def body(stream: bool, **extra) -> bytes:
    return json.dumps({"model": MODEL, "prompt": "Hello", "max_tokens": 8, "stream": stream, **extra}).encode()


def sse_texts(raw: bytes) -> list[str]:
    return [json.loads(e[6:])["choices"][0]["text"] for e in raw.decode().split("\n\n")
            if e.startswith("data: {") and json.loads(e[6:]).get("choices")]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_failure_before_the_first_token_is_retried_elsewhere(tokenizer, stream):
    ok = [TokenChunk("", tokens(tokenizer, " Paris")), TokenChunk("", (), finished=True, finish_reason="length")]
    driver, router = AttemptDriver([[DECODE_DIED], ok]), RecordingRouter()
    status, raw = asyncio.run(call(app_for(tokenizer, driver, router), body(stream)))
    assert status == 200
    text = "".join(sse_texts(raw)) if stream else json.loads(raw)["choices"][0]["text"]
    assert text == " Paris"
    assert router.excluded == [frozenset(), frozenset({"raypd-decode-0"})]
    (rid0, prompt0, params0), (rid1, prompt1, params1) = driver.attempts
    assert rid0 != rid1 and prompt0 == prompt1 and params1 == params0  # the same request, a new id


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.8, "seed": 7}, {"temperature": 0.8}],
                         ids=["greedy", "seeded", "unseeded"])
def test_mid_stream_failure_replays_the_generated_tokens(tokenizer, sampling):
    first, second = tokens(tokenizer, " The capital"), tokens(tokenizer, " is Paris")
    driver = AttemptDriver([[TokenChunk("", first), DECODE_DIED],
                            [TokenChunk("", second[:-1]),
                             TokenChunk("", second[-1:], finished=True, finish_reason="length")]])
    status, raw = asyncio.run(call(app_for(tokenizer, driver, RecordingRouter()),
                                   body(True, stream_options={"include_usage": True}, **sampling)))
    assert status == 200
    assert "".join(sse_texts(raw)) == " The capital is Paris"  # no gap, nothing twice
    (_, prompt0, params0), (_, prompt1, params1) = driver.attempts
    assert prompt1 == prompt0 + list(first)
    assert params1.max_tokens == params0.max_tokens - len(first)
    assert params1.num_replayed_tokens == len(first) and params0.num_replayed_tokens == 0
    assert params1.seed == params0.seed and (params0.seed is not None or params0.greedy)
    if "seed" in sampling:
        assert params0.seed == 7
    usage = [json.loads(e[6:]) for e in raw.decode().split("\n\n") if e.startswith("data: {")][-1]["usage"]
    assert usage["completion_tokens"] == len(first) + len(second)


def test_replays_are_bounded_by_the_migration_limit(tokenizer):
    one = tokens(tokenizer, " a")
    driver = AttemptDriver([[TokenChunk("", one), DECODE_DIED]] * 3)
    status, raw = asyncio.run(call(app_for(tokenizer, driver, RecordingRouter(), migration_limit=2), body(True)))
    assert status == 200 and len(driver.attempts) == 3
    error = [json.loads(e[6:]) for e in raw.decode().split("\n\n") if e.startswith("data: {")][-1]
    assert error["error"]["code"] == "node_failure" and "2 replays" in error["error"]["message"]


def test_all_tokens_in_but_the_end_lost_finishes_with_length(tokenizer):
    eight = tokens(tokenizer, " one two three four five six seven eight")[:8]
    assert len(eight) == 8
    driver = AttemptDriver([[TokenChunk("", eight), DECODE_DIED]])
    status, raw = asyncio.run(call(app_for(tokenizer, driver, RecordingRouter()), body(False)))
    assert status == 200 and json.loads(raw)["choices"][0]["finish_reason"] == "length"
    assert len(driver.attempts) == 1


def test_a_node_that_keeps_failing_leaves_routing(tokenizer):
    now = [0.0]
    breaker = CircuitBreaker(failures=2, window_s=30, cooldown_s=10, clock=lambda: now[0])
    ok = [TokenChunk("", (), finished=True, finish_reason="length")]
    driver = AttemptDriver([[DECODE_DIED], ok, [DECODE_DIED], ok, ok])
    router = RecordingRouter()
    app = app_for(tokenizer, driver, router, breaker=breaker)
    for _ in range(3):
        assert asyncio.run(call(app, body(False)))[0] == 200
    # Two requests each failed once on raypd-decode-0: the third is routed around it from the start.
    assert router.excluded[-1] == frozenset({"raypd-decode-0"})


class OnlyDecode0(Router):
    """A cluster whose one decode node is raypd-decode-0: excluding it leaves nothing."""

    def __init__(self):
        self.excluded: list[frozenset[str]] = []

    async def route(self, request_id, prompt_token_ids, exclude=frozenset(), priority=0):
        self.excluded.append(exclude)
        if "raypd-decode-0" in exclude:
            raise NoNodeError("no live decode node")
        return Route(MIXED_NODE)


def test_the_breaker_never_takes_the_last_node_of_a_role_out(tokenizer):
    breaker = CircuitBreaker(failures=1, window_s=30, cooldown_s=60)
    breaker.failure("raypd-decode-0")
    router = OnlyDecode0()
    ok = [TokenChunk("", tokens(tokenizer, " Paris")), TokenChunk("", (), finished=True, finish_reason="length")]
    status, raw = asyncio.run(call(app_for(tokenizer, AttemptDriver([ok]), router, breaker=breaker), body(False)))
    assert status == 200 and json.loads(raw)["choices"][0]["text"] == " Paris"
    assert router.excluded == [frozenset({"raypd-decode-0"}), frozenset()]  # fail-open, not 503
