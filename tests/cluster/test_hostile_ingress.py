"""Hostile HTTP inputs against a real `raypd serve` (1 prefill + 1 decode node, one ingress replica,
--request-timeout 12), through the official openai client and raw HTTP, while a stream runs on the
same replica: each is answered with its 4xx while the stream is still open; the stream itself ends at
the deadline with an error event and [DONE], a non-stream request past the deadline is a 504, a body
that stops arriving a 408; and afterwards no node holds anything (the deadline aborted both sides).

How long the stream's gaps are while these arrive is a benchmark's question, not a test's:
benchmarks/ingress_hostile.py, figures in docs/benchmarks.md.
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest

from tests.serve.conftest import ServerProcess, request, wait_nodes_idle

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes

MODEL = "SmolLM2-135M-Instruct.Q4_1"
TIMEOUT_S = 12  # the server's --request-timeout: the concurrent stream runs until it
LONG = {"max_tokens": 2000, "ignore_eos": True}  # never finishes within the deadline here


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServerProcess.running(tmp_path_factory.mktemp("hostile") / "raypd-serve.log", "--no-dashboard",
                               "--num-blocks", "256", "--request-timeout", str(TIMEOUT_S)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    with OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def stream_events(port: int, body: dict, out: list, first: threading.Event) -> None:
    """POST a streaming request and append (monotonic time, event data) per SSE event."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        out.append((time.monotonic(), f"status {resp.status}"))
        for line in resp:
            if line.startswith(b"data: "):
                out.append((time.monotonic(), line[6:].decode().strip()))
                first.set()
    finally:
        first.set()
        conn.close()


def slow_post(port: int, body: bytes, send_all: bool = True, gap_s: float = 1.0) -> tuple[int, dict]:
    """POST /v1/completions with `body` declared in full, sent one byte per `gap_s`; with
    send_all=False only the first two bytes are sent, then the client waits for the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body))
        for b in body if send_all else body[:2]:
            s.sendall(bytes([b]))
            time.sleep(gap_s)
        raw = b""
        while b"\r\n\r\n" not in raw or len(raw.partition(b"\r\n\r\n")[2]) < _length(raw):
            chunk = s.recv(65536)
            if not chunk:
                break
            raw += chunk
    head, _, payload = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)["error"]


def _length(raw: bytes) -> int:
    for line in raw.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 1 << 30


def test_hostile_inputs_get_4xx_while_a_stream_runs_and_the_deadline_frees_both_nodes(server, client):
    import openai

    answered: dict[str, tuple[float, int, str | None]] = {}

    def via_client(name: str, call) -> None:
        try:
            call()
            answered[name] = (time.monotonic(), 200, None)
        except openai.APIStatusError as e:
            answered[name] = (time.monotonic(), e.status_code, (e.body or {}).get("code"))

    def via_raw(name: str, body: bytes) -> None:
        status, _, raw = request(server.port, "POST", "/v1/completions", body,
                                 {"Content-Type": "application/json"}, api_key=None)
        answered[name] = (time.monotonic(), status, json.loads(raw)["error"]["code"] if raw else None)

    def via_slow(name: str, body: bytes, send_all: bool) -> None:
        status, err = slow_post(server.port, body, send_all)
        answered[name] = (time.monotonic(), status, err["code"])

    # The openai client spends ~9 s encoding a million-element prompt before it sends a byte, longer
    # than the stream's window, so it goes first; the same body goes raw during the stream.
    via_client("1M-element prompt array", lambda: client.completions.create(
        model=MODEL, prompt=[[1]] * 1_000_000, n=16, max_tokens=1))
    million = json.dumps({"model": MODEL, "prompt": [[1]] * 1_000_000, "n": 16}, separators=(",", ":")).encode()

    events: list = []
    first = threading.Event()
    background = [
        threading.Thread(target=stream_events, args=(server.port, {
            "model": MODEL, "messages": [{"role": "user", "content": "Tell me a long story."}], "stream": True,
            **LONG}, events, first)),
        threading.Thread(target=via_client, args=("past the deadline", lambda: client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Tell me a story."}],
            max_tokens=LONG["max_tokens"], extra_body={"ignore_eos": True}))),
        threading.Thread(target=via_slow, args=("stalled body", json.dumps({"model": MODEL}).encode(), False)),
        threading.Thread(target=via_slow, args=("one byte per second", b"[1]", True)),
    ]
    for t in background:
        t.start()
    assert first.wait(TIMEOUT_S)
    via_raw("1M-element prompt array, raw", million)
    via_client("n=16 with 64 prompts", lambda: client.completions.create(
        model=MODEL, prompt=["Hi"] * 64, n=16, max_tokens=1))
    via_client("10,000 messages", lambda: client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}] * 10_000, max_tokens=1))
    via_client("1 MB stop string", lambda: client.completions.create(
        model=MODEL, prompt="Hi", stop="x" * (1 << 20), max_tokens=1))
    via_raw("deeply nested JSON", b'{"model": "%s", "prompt": ' % MODEL.encode() + b"[" * 100_000
            + b"]" * 100_000 + b"}")
    via_raw("nested 10,000 deep", b'{"model": "%s", "prompt": ' % MODEL.encode() + b"[" * 10_000
            + b"]" * 10_000 + b"}")
    for t in background:
        t.join()

    codes = {name: (status, code) for name, (_, status, code) in answered.items()}
    assert 400 <= codes["1M-element prompt array"][0] < 500, codes  # 413 or 400, by how the client encodes
    assert codes["1M-element prompt array, raw"] == (400, "json_too_complex"), codes
    assert codes["n=16 with 64 prompts"] == (400, "too_many_generations"), codes
    assert codes["10,000 messages"] == (400, "invalid_value"), codes
    assert codes["1 MB stop string"] == (400, "invalid_value"), codes
    assert codes["deeply nested JSON"] == (400, "json_too_complex"), codes
    assert codes["nested 10,000 deep"] == (400, "invalid_json"), codes
    assert codes["one byte per second"] == (400, "invalid_json"), codes  # `[1]` is not an object
    assert codes["stalled body"] == (408, "body_timeout"), codes
    assert codes["past the deadline"] == (504, "request_timeout"), codes
    # The stream was open throughout: it answered 200, streamed text, and every 4xx came before its
    # last events: the deadline's error, then [DONE].
    assert events[0][1] == "status 200" and len(events) > 3, events[:5]
    assert json.loads(events[-2][1])["error"]["code"] == "request_timeout", events[-3:]
    assert events[-1][1] == "[DONE]"
    in_window = [t for name, (t, status, _) in answered.items() if status < 408 and name != "1M-element prompt array"]
    assert len(in_window) == 7 and max(in_window) < events[-2][0], (answered, events[-2])
    # Both deadlines aborted their requests on both nodes: nothing held, every block free or cached.
    nodes = wait_nodes_idle(server.port)
    assert {n["role"] for n in nodes} == {"prefill", "decode"}
