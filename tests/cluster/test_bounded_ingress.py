"""Too much and bad input through HTTP against one real `raypd serve` (1 prefill + 1 decode node over
NIXL, one ingress replica) with small bounds at the ingress and at each node and a short request
deadline (--request-timeout 20), through the official openai client and raw HTTP.

The flood (issue 16, must-hold 3) takes concurrent requests well beyond the bounds: every answer is a
200 that finishes or a 429 with Retry-After and an OpenAI error body (from the ingress's gate or a
node's full queue); none is a 5xx. It comes in two waves: the first builds a backlog at the prefill
node (2 running slots), the second arrives while it lasts, so that most of it meets full queues: the
gate's, or the prefill node's once its backlog passes 2 (which of them, and how many, depends on
timing: only the union is asserted, and the counts are printed).

Hostile inputs arrive while a stream runs on the same replica: each is answered with its 4xx while
the stream is still open; the stream itself ends at the deadline with an error event and [DONE], a
non-stream request past the deadline is a 504, a body that stops arriving a 408. How long the
stream's gaps are meanwhile is a benchmark's question, not a test's: benchmarks/ingress_hostile.py,
figures in docs/benchmarks.md.

After each test no node holds anything (the deadline aborted both sides of its requests). The two
share one server because what each needs of it fits the other: the flood's requests are 8 tokens,
far inside the deadline, and the hostile test holds at most two node slots at a time.
"""
from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time

import pytest

from raypd.benchmarks.ingress_hostile import read_response
from tests.serve.conftest import MODEL, ServerProcess, node_report, request, wait_nodes_idle

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes

WAVE = 24
# Per node: 2 running, 2 more waiting; per ingress replica: 32 in progress, 4 more queued. The
# ingress takes more than the prefill node holds, so both the gate and the node refuse some.
BOUNDS = ("--max-running-requests", "2", "--max-waiting-requests", "2",
          "--max-ongoing-requests", "32", "--max-queued-requests", "4")
REFUSALS = {"ingress_queue_full", "node_queue_full"}
TIMEOUT_S = 20  # the server's --request-timeout: the hostile test's concurrent stream runs until it
LONG = {"max_tokens": 4000, "ignore_eos": True}  # never finishes within the deadline, even on a fast CPU


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServerProcess.running(tmp_path_factory.mktemp("bounded") / "raypd-serve.log", "--no-dashboard",
                               "--num-blocks", "256", "--request-timeout", str(TIMEOUT_S), *BOUNDS) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    with OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


# -- the flood ------------------------------------------------------------------------------------
async def one(client, i: int) -> tuple[str, object]:
    """('ok', finish_reason) | ('429', (retry-after, error body)) | ('other', what happened)."""
    import openai

    messages = [{"role": "user", "content": f"Count from {i} to {i + 20}, one number per line."}]
    try:
        if i % 2:
            stream = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                                          stream=True)
            finish = None
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            return "ok", finish
        r = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)
        return "ok", r.choices[0].finish_reason
    except openai.RateLimitError as e:
        body = e.body.get("error", e.body) if isinstance(e.body, dict) else e.body
        return "429", (e.response.headers.get("retry-after"), body)
    except openai.APIStatusError as e:
        return "other", (e.status_code, e.body)
    except openai.APIError as e:  # a stream that ended with an error event, a broken connection
        return "other", repr(e)


async def backlog(port: int, wave: list[asyncio.Future], bound_s: float = 30.0) -> None:
    """Until the prefill node reports more than 2 requests waiting, or the wave is over (bounded):
    the second wave is sent then, whatever the nodes hold."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound_s
    while loop.time() < deadline and not all(f.done() for f in wave):
        nodes = await asyncio.to_thread(node_report, port)
        if any(n["role"] == "prefill" and n.get("load", {}).get("waiting", 0) > 2 for n in nodes):
            return
        await asyncio.sleep(0.05)


def test_a_flood_gets_429s_with_retry_after_no_5xx_and_leaves_no_block_held(server):
    from openai import AsyncOpenAI

    async def flood():
        async with AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0,
                               timeout=120) as client:
            first = [asyncio.ensure_future(one(client, i)) for i in range(WAVE)]
            await backlog(server.port, first)
            second = [asyncio.ensure_future(one(client, i)) for i in range(WAVE, 2 * WAVE)]
            return await asyncio.gather(*first, *second)
    results = asyncio.run(flood())
    by_kind = {kind: [what for k, what in results if k == kind] for kind in ("ok", "429", "other")}
    summary = {kind: len(v) for kind, v in by_kind.items()}
    codes = [body.get("code") if isinstance(body, dict) else body for _, body in by_kind["429"]]
    print(f"flood of {2 * WAVE}: {summary}, 429 codes {({c: codes.count(c) for c in set(codes)})}")
    assert not by_kind["other"], (summary, by_kind["other"][:5])      # no 5xx, no broken stream
    assert by_kind["ok"] and by_kind["429"], summary                   # some served, some refused
    assert all(reason in ("stop", "length") for reason in by_kind["ok"]), by_kind["ok"]  # every accepted one finished
    for retry_after, body in by_kind["429"]:
        assert retry_after is not None and int(retry_after) >= 1, retry_after
        assert isinstance(body, dict) and body.get("type") == "rate_limit_error", body
        assert body.get("code") in REFUSALS and body.get("message"), body
    nodes = wait_nodes_idle(server.port)                               # 0 blocks held afterwards
    assert all(not any(n["held"].values()) for n in nodes), nodes
    assert all(n["load"]["free_blocks"] == n["load"]["total_blocks"] for n in nodes), nodes


# -- hostile inputs ------------------------------------------------------------------------------
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
        status, payload = read_response(s)
    return status, json.loads(payload)["error"]


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
