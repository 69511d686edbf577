"""Bounded ingress work (issue 16), without Ray: every limit is checked before the work it bounds
grows (prompts x n before tokenizing, JSON structure before parsing, text length before tokenizing),
tokenization and templates run off the event loop on a bounded pool, a slow body ends in 408, and a
request past its deadline ends in 504 (or an error event in a stream) with its driver streams closed,
which is the abort on both nodes. Driven through the ASGI app with the test doubles of
test_ingress_app.py; the real server runs the same inputs in tests/cluster/test_bounded_ingress.py."""
from __future__ import annotations

import asyncio
import json
import threading

import pytest

from raypd.cluster.openai.api_errors import BadRequest
from raypd.cluster.openai.json_shape import MAX_JSON_NODES, check_json_shape
from raypd.cluster.openai.params import MAX_GENERATIONS
from raypd.cluster.openai.prompts import PromptBuilder
from raypd.cluster.openai.request_schema import MAX_MESSAGES, MAX_STOP_CHARS, CompletionRequest
from raypd.cluster.serve.app import build_app
from raypd.cluster.serve.generation import Generator
from raypd.cluster.serve.service import OpenAIService
from raypd.protocol.messages import TokenChunk
from tests.serve.test_ingress_app import LIMITS, MODEL, AnyRoute, ScriptedDriver, tokens

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


class SpyTokenizer:
    """The real tokenizer, recording which thread ran each call; `gate` (if set) holds every call
    until it is set, to keep the pool busy."""

    def __init__(self, tokenizer, gate: threading.Event | None = None):
        self.inner = tokenizer
        self.hf = tokenizer.hf
        self.gate = gate
        self.calls: list[tuple[str, int]] = []

    def _record(self, name: str) -> None:
        self.calls.append((name, threading.get_ident()))
        if self.gate is not None:
            assert self.gate.wait(30)

    def encode(self, text):
        self._record("encode")
        return self.inner.encode(text)

    def apply_chat_template(self, messages):
        self._record("template")
        return self.inner.apply_chat_template(messages)

    def decode(self, ids):
        self._record("decode")
        return self.inner.decode(ids)


def done_chunks(tokenizer) -> list[TokenChunk]:
    return [TokenChunk("", tokens(tokenizer, " Paris")), TokenChunk("", (), finished=True, finish_reason="length")]


def make_app(tokenizer, driver=None, request_timeout_s: float | None = None, prompts: PromptBuilder | None = None,
             max_body_bytes: int = 8 << 20):
    driver = driver or ScriptedDriver(done_chunks(tokenizer.inner if isinstance(tokenizer, SpyTokenizer) else tokenizer))
    service = OpenAIService(tokenizer, LIMITS, Generator(driver, AnyRoute(), tokenizer.hf), [], prompts)
    return build_app(service, api_key=None, max_body_bytes=max_body_bytes, request_timeout_s=request_timeout_s)


async def post(app, path: str, body: bytes | dict, parts: list[bytes] | None = None,
               then_stall: bool = False) -> tuple[int, dict, bytes]:
    """One POST through the ASGI interface: (status, headers, body). `parts` sends the body in pieces
    (more_body=True between them); `then_stall` never sends the last piece."""
    raw = json.dumps(body).encode() if isinstance(body, dict) else body
    pieces = list(parts) if parts is not None else [raw]
    sent: list[dict] = []

    async def receive():
        if pieces:
            piece = pieces.pop(0)
            return {"type": "http.request", "body": piece, "more_body": bool(pieces) or then_stall}
        await asyncio.Event().wait()  # no more body; the client neither sends nor leaves
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 80)}
    await asyncio.wait_for(app(scope, receive, send), 60)
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {k.decode().lower(): v.decode() for k, v in start.get("headers", [])}
    return start["status"], headers, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def error(status: int, raw: bytes, expected_status: int = 400) -> dict:
    assert status == expected_status, (status, raw[:300])
    err = json.loads(raw)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def completion(**fields) -> dict:
    return {"model": MODEL, "prompt": "Hello", "max_tokens": 8, **fields}


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, **fields}


# --- limits, each before the work it bounds ---------------------------------------------------------

def test_prompts_times_n_is_refused_before_any_prompt_is_tokenized(tokenizer):
    spy = SpyTokenizer(tokenizer)
    status, _, raw = asyncio.run(post(make_app(spy), COMPLETIONS, completion(prompt=["Hi"] * 64, n=16)))
    err = error(status, raw)
    assert (err["param"], err["code"]) == ("n", "too_many_generations")
    assert "64 x 16" in err["message"] and str(MAX_GENERATIONS) in err["message"]
    assert spy.calls == []
    status, _, raw = asyncio.run(post(make_app(spy), CHAT, chat(n=16)))  # 1 x 16 fits
    assert status == 200, raw


def test_a_prompt_list_is_at_most_64_prompts(tokenizer):
    for prompt in ([[1]] * 65, ["Hi"] * 65):
        status, _, raw = asyncio.run(post(make_app(tokenizer), COMPLETIONS, completion(prompt=prompt)))
        assert error(status, raw)["param"] == "prompt"


def test_a_million_element_prompt_array_is_refused_unparsed(tokenizer):
    raw_body = json.dumps(completion(prompt=[[1]] * 1_000_000, n=16), separators=(",", ":")).encode()
    assert len(raw_body) < 8 << 20  # inside the app's body limit: the structure check is what refuses it
    status, _, raw = asyncio.run(post(make_app(tokenizer), COMPLETIONS, raw_body))
    err = error(status, raw)
    assert err["code"] == "json_too_complex" and "1000006 arrays" in err["message"]  # 1M + the list, body, 4 members


def test_json_structure_is_counted_outside_strings():
    text = '[{:"\\' * 20_000  # brackets, colons, quotes and backslashes inside a string are text
    check_json_shape(json.dumps({"prompt": text}).encode())
    # The body, its member "m" and the object in it are 3 nodes; then one per member of that object.
    check_json_shape(json.dumps({"m": {str(i): 1 for i in range(MAX_JSON_NODES - 3)}}).encode())
    with pytest.raises(BadRequest, match=f"holds {MAX_JSON_NODES + 1} arrays, objects and members") as e:
        check_json_shape(json.dumps({"m": {str(i): 1 for i in range(MAX_JSON_NODES - 2)}}).encode())
    assert e.value.code == "json_too_complex"


@pytest.mark.parametrize("body", [
    completion(metadata={str(i): "x" for i in range(70_000)}),    # members of one object
    completion(prompt=[[]] * 70_000),                              # arrays
    completion(user=[{}] * 70_000),                                # objects
], ids=["members", "arrays", "objects"])
def test_structure_heavy_bodies_are_400_before_parsing(tokenizer, body):
    path = COMPLETIONS
    status, _, raw = asyncio.run(post(make_app(tokenizer), path, body))
    assert error(status, raw)["code"] == "json_too_complex"


def test_deeply_nested_json_is_invalid_json(tokenizer):
    raw_body = b'{"model": "%s", "prompt": ' % MODEL.encode() + b"[" * 10_000 + b"]" * 10_000 + b"}"
    status, _, raw = asyncio.run(post(make_app(tokenizer), COMPLETIONS, raw_body))
    err = error(status, raw)
    assert err["code"] == "invalid_json" and "recursion limit" in err["message"]


def test_list_validation_stops_at_the_first_bad_item():
    """Without fail_fast pydantic describes every bad item: 800,000 nulls took 16 s to report."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as e:
        CompletionRequest.model_validate_json(json.dumps(completion(prompt=[None] * 100_000)))
    assert e.value.error_count() <= 4  # one per prompt form, not one per item
    with pytest.raises(ValidationError) as e:
        CompletionRequest.model_validate_json(json.dumps(completion(stop_token_ids=["x"] * 100_000)))
    assert e.value.error_count() == 1


def test_messages_are_at_most_max_messages(tokenizer):
    spy = SpyTokenizer(tokenizer)
    many = [{"role": "user", "content": "Hi"}] * (MAX_MESSAGES + 1)
    status, _, raw = asyncio.run(post(make_app(spy), CHAT, chat(messages=many)))
    err = error(status, raw)
    assert err["param"] == "messages" and str(MAX_MESSAGES) in err["message"]
    assert spy.calls == []
    status, _, raw = asyncio.run(post(make_app(spy), CHAT, chat(messages=many[:MAX_MESSAGES], max_tokens=1)))
    assert status != 400 or json.loads(raw)["error"]["code"] == "context_length_exceeded"
    assert [name for name, _ in spy.calls] == ["template"]


@pytest.mark.parametrize("stop", [["a", "b", "c", "d", "e"], "x" * (1 << 20), ["x" * (MAX_STOP_CHARS + 1)]],
                         ids=["five strings", "1 MB string", "257 chars in a list"])
def test_stop_strings_are_bounded(tokenizer, stop):
    status, _, raw = asyncio.run(post(make_app(tokenizer), COMPLETIONS, completion(stop=stop)))
    assert error(status, raw)["param"] == "stop"


def test_a_stop_string_of_max_length_is_accepted(tokenizer):
    status, _, raw = asyncio.run(post(make_app(tokenizer), COMPLETIONS, completion(stop=["y" * MAX_STOP_CHARS] * 4)))
    assert status == 200, raw


def test_text_longer_than_the_context_can_hold_is_refused_untokenized(tokenizer):
    spy = SpyTokenizer(tokenizer)
    app = make_app(spy)
    limit = PromptBuilder(spy, LIMITS).max_text_chars
    assert limit == LIMITS.context_len * max(map(len, tokenizer.hf.get_vocab()))
    status, _, raw = asyncio.run(post(app, COMPLETIONS, completion(prompt="a" * (limit + 1))))
    assert error(status, raw)["code"] == "context_length_exceeded"
    status, _, raw = asyncio.run(post(app, CHAT, chat(messages=[{"role": "user", "content": "a" * (limit + 1)}])))
    assert error(status, raw)["code"] == "context_length_exceeded"
    assert spy.calls == []


# --- off the event loop, on a bounded pool ---------------------------------------------------------

def test_templates_tokenization_and_echo_run_off_the_event_loop(tokenizer):
    spy = SpyTokenizer(tokenizer)
    app = make_app(spy)

    async def three():
        return threading.get_ident(), [
            await post(app, CHAT, chat()),
            await post(app, COMPLETIONS, completion(prompt="Hi")),
            await post(app, COMPLETIONS, completion(prompt=[list(tokens(tokenizer, "Hello there"))], echo=True))]

    loop_thread, answers = asyncio.run(three())
    assert [a[0] for a in answers] == [200, 200, 200], answers
    assert [name for name, _ in spy.calls] == ["template", "encode", "decode"]
    assert all(thread != loop_thread for _, thread in spy.calls)
    assert json.loads(answers[2][2])["choices"][0]["text"].startswith("Hello there")


def test_a_full_prompt_pool_answers_429(tokenizer):
    gate = threading.Event()
    spy = SpyTokenizer(tokenizer, gate)
    app = make_app(spy, prompts=PromptBuilder(spy, LIMITS, workers=1, max_pending=1))

    async def scenario():
        first = asyncio.ensure_future(post(app, CHAT, chat()))
        while not spy.calls:  # the first request's template is running, holding the one slot
            await asyncio.sleep(0.01)
        second = await post(app, COMPLETIONS, completion())
        gate.set()
        return await first, second

    first, (status, headers, raw) = asyncio.run(scenario())
    err = error(status, raw, 429)
    assert err["code"] == "ingress_busy" and headers["retry-after"] == "1"
    assert first[0] == 200, first


# --- deadlines ------------------------------------------------------------------------------------

class StallingDriver(ScriptedDriver):
    """Sends its chunks, then stalls (a request that would outlive any deadline)."""

    async def generate(self, request_id, prompt_token_ids, params, prefill, decode=None):
        try:
            for c in self.chunks:
                yield TokenChunk(request_id, c.token_ids)
            await asyncio.sleep(3600)
        finally:
            self.closed.append(request_id)


def test_deadline_non_stream_is_504_and_aborts(tokenizer):
    driver = StallingDriver([TokenChunk("", tokens(tokenizer, " Paris"))])
    status, _, raw = asyncio.run(post(make_app(tokenizer, driver, request_timeout_s=0.5), CHAT, chat(n=2)))
    err = error(status, raw, 504)
    assert (err["type"], err["code"]) == ("timeout_error", "request_timeout")
    assert len(driver.closed) == 2  # both choices' driver streams closed: the abort on their nodes


def test_deadline_mid_stream_is_an_error_event_then_done(tokenizer):
    driver = StallingDriver([TokenChunk("", tokens(tokenizer, " Paris"))])
    status, _, raw = asyncio.run(post(make_app(tokenizer, driver, request_timeout_s=0.5), COMPLETIONS,
                                      completion(stream=True)))
    assert status == 200
    events = [e[6:] for e in raw.decode().split("\n\n") if e.startswith("data: ")]
    assert json.loads(events[0])["choices"][0]["text"] == " Paris"
    assert json.loads(events[-2])["error"]["code"] == "request_timeout"
    assert events[-1] == "[DONE]"
    assert len(driver.closed) == 1


def test_deadline_while_the_template_runs_is_504(tokenizer):
    gate = threading.Event()
    spy = SpyTokenizer(tokenizer, gate)
    driver = ScriptedDriver(done_chunks(tokenizer))
    try:
        status, _, raw = asyncio.run(post(make_app(spy, driver, request_timeout_s=0.3), CHAT, chat()))
    finally:
        gate.set()
    assert error(status, raw, 504)["code"] == "request_timeout"
    assert driver.closed == []  # never reached the nodes


def test_a_body_that_stops_arriving_is_408(tokenizer):
    raw_body = json.dumps(completion()).encode()
    status, _, raw = asyncio.run(post(make_app(tokenizer, request_timeout_s=0.3), COMPLETIONS, raw_body,
                                      parts=[raw_body[:1], raw_body[1:5]], then_stall=True))
    err = error(status, raw, 408)
    assert (err["type"], err["code"]) == ("timeout_error", "body_timeout")


def test_a_body_in_pieces_within_the_deadline_is_served(tokenizer):
    raw_body = json.dumps(completion()).encode()
    status, _, raw = asyncio.run(post(make_app(tokenizer, request_timeout_s=30), COMPLETIONS, raw_body,
                                      parts=[raw_body[i:i + 1] for i in range(len(raw_body))]))
    assert status == 200, raw


# --- configuration -------------------------------------------------------------------------------

def test_request_timeout_flag_reaches_the_config():
    from raypd.cluster.cli.main import build_parser
    from raypd.cluster.cli.serve import config_from_args
    from raypd.cluster.serve.config import ServeConfig, ServeConfigError

    assert ServeConfig().request_timeout_s == 600.0
    args = build_parser().parse_args(["serve", "--request-timeout", "7.5"])
    assert config_from_args(args).request_timeout_s == 7.5
    assert ServeConfig.from_args({"request_timeout_s": 30}).request_timeout_s == 30
    for bad in (0, -1.0):
        with pytest.raises(ServeConfigError, match="--request-timeout must be > 0"):
            ServeConfig(request_timeout_s=bad)
