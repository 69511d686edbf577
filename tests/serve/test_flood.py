"""Back-pressure through HTTP (issue 16, must-hold 3): a real `raypd serve` (1 prefill + 1 decode
node over NIXL) with small bounds at the ingress and at each node takes a flood of concurrent
requests well beyond them through the official openai client. Every answer is a 200 that finishes or
a 429 with Retry-After and an OpenAI error body (from the ingress's gate or a node's full queue);
none is a 5xx; afterwards every node is idle with no block held.

The flood comes in two waves: the first builds a backlog at the prefill node (2 running slots), the
second arrives while it lasts, so that most of it meets full queues: the gate's, or the prefill
node's once its backlog passes 2 (which of them, and how many, depends on timing: only the union is
asserted, and the counts are printed).
"""
from __future__ import annotations

import asyncio

import pytest

from tests.serve.conftest import MODEL, ServerProcess, node_report, wait_nodes_idle

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes

WAVE = 24
# Per node: 2 running, 2 more waiting; per ingress replica: 32 in progress, 4 more queued. The
# ingress takes more than the prefill node holds, so both the gate and the node refuse some.
BOUNDS = ("--max-running-requests", "2", "--max-waiting-requests", "2",
          "--max-ongoing-requests", "32", "--max-queued-requests", "4")
REFUSALS = {"ingress_queue_full", "node_queue_full"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log_path = tmp_path_factory.mktemp("flood") / "raypd-serve.log"
    with ServerProcess.running(log_path, "--no-dashboard", "--num-blocks", "256", *BOUNDS) as srv:
        yield srv


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
