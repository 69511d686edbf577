"""Every client mistake answers with its status and an OpenAI-style error body, never a 5xx; a
hypothesis fuzz of malformed bodies finds no 5xx and leaves no block held on any node."""
from __future__ import annotations

import json
import socket

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.serve.conftest import API_KEY, MAX_BODY_BYTES, MODEL, request, wait_nodes_idle

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "Hi"}]


def error_of(status: int, body: bytes) -> dict:
    assert 400 <= status < 500, (status, body[:500])
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    return err


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": MESSAGES, "max_tokens": 2, **fields}


def completion(**fields) -> dict:
    return {"model": MODEL, "prompt": "Hi", "max_tokens": 2, **fields}


CASES = [
    # (name, path, body, status, param)
    ("malformed json", CHAT, b'{"model": "x", "messages": [', 400, None),
    ("empty body", CHAT, b"", 400, None),
    ("not an object", COMPLETIONS, b"[1, 2]", 400, None),
    ("missing messages", CHAT, {"model": MODEL}, 400, "messages"),
    ("missing model", COMPLETIONS, {"prompt": "Hi"}, 400, "model"),
    ("wrong type max_tokens", CHAT, chat(max_tokens="5"), 400, "max_tokens"),
    ("wrong type messages", CHAT, chat(messages="Hi"), 400, "messages"),
    ("float n", CHAT, chat(n=1.5), 400, "n"),
    ("bad role", CHAT, chat(messages=[{"role": "wizard", "content": "Hi"}]), 400, "messages[0].role"),
    ("empty messages", CHAT, chat(messages=[]), 400, "messages"),
    ("unknown field", CHAT, chat(max_token=5), 400, "max_token"),
    ("unknown model", CHAT, chat(model="gpt-4o"), 400, "model"),
    ("temperature < 0", CHAT, chat(temperature=-0.5), 400, "temperature"),
    ("temperature huge", COMPLETIONS, completion(temperature=1e9), 400, "temperature"),
    ("top_p 0", CHAT, chat(top_p=0.0), 400, "top_p"),
    ("top_p > 1", COMPLETIONS, completion(top_p=1.5), 400, "top_p"),
    ("n 0", CHAT, chat(n=0), 400, "n"),
    ("n too many", CHAT, chat(n=1000), 400, "n"),
    ("max_tokens 0", COMPLETIONS, completion(max_tokens=0), 400, "max_tokens"),
    ("max_tokens over context", CHAT, chat(max_tokens=10**6), 400, "max_tokens"),
    ("seed too wide", CHAT, chat(seed=2**70), 400, "seed"),
    ("presence_penalty", CHAT, chat(presence_penalty=5), 400, "presence_penalty"),
    ("stop token out of vocab", COMPLETIONS, completion(stop_token_ids=[10**9]), 400, "stop_token_ids"),
    ("token prompt out of vocab", COMPLETIONS, completion(prompt=[1, 2, 10**9]), 400, "prompt"),
    ("empty prompt", COMPLETIONS, completion(prompt=""), 400, "prompt"),
    ("prompt over the context", COMPLETIONS, completion(prompt=list(range(1, 9000))), 400, "prompt"),
    ("logprobs chat", CHAT, chat(logprobs=True), 400, "logprobs"),
    ("logprobs completions", COMPLETIONS, completion(logprobs=2), 400, "logprobs"),
    ("image content", CHAT, chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
     400, "messages[0].content"),
    ("tools", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools"),
    ("stream_options without stream", CHAT, chat(stream_options={"include_usage": True}), 400, "stream_options"),
    ("empty stop string", COMPLETIONS, completion(stop=[""]), 400, "stop"),
    ("priority not an integer", CHAT, chat(priority="high"), 400, "priority"),
    ("priority too wide", COMPLETIONS, completion(priority=2**40), 400, "priority"),
]


@pytest.mark.parametrize("name,path,body,status,param", CASES, ids=[c[0] for c in CASES])
def test_client_errors(server, name, path, body, status, param):
    got, _, raw = request(server.port, "POST", path, body)
    assert got == status, raw[:500]
    err = error_of(got, raw)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param, err


def test_context_length_error_names_the_limit(server):
    _, _, raw = request(server.port, "POST", COMPLETIONS, completion(prompt=list(range(1, 9000))))
    err = json.loads(raw)["error"]
    assert err["code"] == "context_length_exceeded" and "8192" in err["message"]


def test_unknown_model_code(server):
    _, _, raw = request(server.port, "POST", CHAT, chat(model="nope"))
    assert json.loads(raw)["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("key", [None, "wrong-key"])
def test_api_key_required(server, key):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    status, _, raw = request(server.port, "POST", CHAT, chat(), headers=headers, api_key=None)
    assert status == 401
    assert error_of(status, raw)["code"] in ("missing_api_key", "invalid_api_key")
    status, _, _ = request(server.port, "GET", "/v1/models", headers=headers, api_key=None)
    assert status == 401
    status, _, _ = request(server.port, "GET", "/health", api_key=None)  # probes need no key
    assert status == 200


def test_official_client_with_wrong_key_raises_authentication_error(base_url):
    import openai

    with openai.OpenAI(base_url=base_url, api_key="nope", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError):
            c.models.list()


def test_body_over_the_limit_is_413(server):
    big = completion(prompt="x " * MAX_BODY_BYTES)
    status, _, raw = request(server.port, "POST", COMPLETIONS, big)
    assert status == 413 and error_of(status, raw)["code"] == "request_too_large"


def test_chunked_body_over_the_limit_is_413(server):
    """No Content-Length: the limit is enforced while reading."""
    piece = b"x" * 65536
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                     + f"Authorization: Bearer {API_KEY}\r\n\r\n".encode())
        try:
            for _ in range(MAX_BODY_BYTES // len(piece) + 2):
                sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before the body ends
        head = sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 413"), head[:200]


def test_unknown_route_and_method(server):
    status, _, raw = request(server.port, "GET", "/v1/nothing")
    assert status == 404 and error_of(status, raw)["code"] == "not_found"
    status, _, raw = request(server.port, "GET", CHAT)
    assert status == 405 and error_of(status, raw)["code"] == "method_not_allowed"


# -- fuzz --------------------------------------------------------------------------------------------
JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                      st.text(max_size=20))
JSON = st.recursive(JSON_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                    max_leaves=12)
def floats(lo: float, hi: float):
    return st.one_of(st.floats(lo, hi), st.just(float("nan")))


# Values that are valid, borderline or wrong for each field; a valid request stays tiny so the fuzz
# run is bounded (max_tokens small or invalid, n small or invalid).
FIELD = {
    "model": st.sampled_from([MODEL, "", "other", None, 3]),
    "messages": st.one_of(st.just(MESSAGES), st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", "x", None]),
         "content": st.one_of(st.text(max_size=30), JSON)}), max_size=3), JSON),
    "prompt": st.one_of(st.text(max_size=40), st.lists(st.integers(-5, 60000), max_size=8),
                        st.lists(st.text(max_size=10), max_size=3), JSON),
    "max_tokens": st.one_of(st.integers(-3, 4), st.sampled_from([10**9, 2**64, "3", 2.5, None])),
    "max_completion_tokens": st.one_of(st.integers(-1, 3), st.sampled_from([10**12, "2", None])),
    "n": st.one_of(st.integers(-1, 3), st.sampled_from([17, 10**6, "2", 1.0, None])),
    "temperature": st.one_of(floats(-2, 3), st.sampled_from([float("inf"), "1", None, 10**40])),
    "top_p": st.one_of(floats(-1, 2), st.sampled_from([0, None, "x"])),
    "seed": st.one_of(st.integers(-2**70, 2**70), st.sampled_from([None, "1", 1.5])),
    "stop": st.one_of(st.text(max_size=5), st.lists(st.text(max_size=5), max_size=6), JSON),
    "stop_token_ids": st.one_of(st.lists(st.integers(-3, 70000), max_size=3), JSON),
    "stream": st.one_of(st.booleans(), JSON_LEAF),
    "logprobs": JSON_LEAF,
    "presence_penalty": st.one_of(floats(-3, 3), JSON_LEAF),
    "stream_options": st.one_of(st.none(), st.fixed_dictionaries({"include_usage": JSON_LEAF}), JSON),
    "echo": JSON_LEAF,
    "top_k": st.one_of(st.integers(-3, 5), JSON_LEAF),
}
OPTIONAL = {k: v for k, v in FIELD.items() if k not in ("model", "messages", "prompt", "max_tokens")}
# Mostly valid bodies with a few odd fields: these reach the nodes, so the fuzz also exercises
# generation, streaming and the abort/free paths, not only validation.
def near_valid(base: dict) -> st.SearchStrategy:
    odd = st.lists(st.sampled_from(sorted(OPTIONAL)), max_size=2, unique=True).flatmap(
        lambda keys: st.fixed_dictionaries({k: OPTIONAL[k] for k in keys}))
    return st.tuples(st.fixed_dictionaries(base), odd).map(lambda t: {**t[0], **t[1]})


NEAR_VALID = {
    CHAT: near_valid({"model": st.just(MODEL), "messages": st.just(MESSAGES), "max_tokens": st.integers(1, 3)}),
    COMPLETIONS: near_valid({"model": st.just(MODEL), "max_tokens": st.integers(1, 3),
                             "prompt": st.one_of(st.text(min_size=1, max_size=40),
                                                 st.lists(st.integers(0, 49151), min_size=1, max_size=8))}),
}
ANY_BODY = st.one_of(
    st.fixed_dictionaries({}, optional=FIELD),
    st.dictionaries(st.sampled_from(sorted(FIELD) + ["zzz", "messages "]), JSON, max_size=6),
)
RAW = st.one_of(st.binary(max_size=64), st.text(max_size=64).map(str.encode),
                JSON.map(lambda v: json.dumps(v).encode()))


def test_fuzz_no_5xx_then_no_block_held(server):
    """Malformed and odd bodies answer below 500 with an error body; afterwards every node is idle and
    its block accounting adds up (the bodies that reached the nodes freed what they took)."""
    @settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data())
    def one_body(data):
        path = data.draw(st.sampled_from([CHAT, COMPLETIONS]))
        near = NEAR_VALID[path].map(lambda b: json.dumps(b).encode())
        body = data.draw(st.one_of(near, near, ANY_BODY.map(lambda b: json.dumps(b).encode()), RAW))
        status, headers, raw = request(server.port, "POST", path, body, headers={"Content-Type": "application/json"})
        event(f"HTTP {status}")  # --hypothesis-show-statistics: how many bodies got through to the nodes
        assert status and status < 500, (status, body[:300], raw[:300])
        if status >= 400:
            error_of(status, raw)

    one_body()
    wait_nodes_idle(server.port)
