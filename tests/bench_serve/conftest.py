"""A fake OpenAI-compatible server on 127.0.0.1 for the bench's client: each request's prompt (or
last message) names what the server does with it."""
from __future__ import annotations

import asyncio
import json
import threading

import pytest
from aiohttp import web

TOKENS = ["Hello", " there", ",", " friend", "."]


def _chunk(text: str, chat: bool) -> bytes:
    choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
    return b"data: " + json.dumps({"id": "x", "object": "chunk", "choices": [choice]}).encode() + b"\n\n"


async def _completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    chat = "messages" in body
    what = body["messages"][-1]["content"] if chat else body["prompt"]
    if what == "500":
        return web.json_response({"error": {"message": "boom", "type": "server_error"}}, status=500)
    if what == "429":
        return web.json_response({"error": {"message": "busy"}}, status=429)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i, tok in enumerate(TOKENS):
        if what == "drop" and i == 2:
            assert request.transport is not None
            request.transport.close()  # the connection dies mid-stream, no [DONE]
            return resp
        if what == "malformed" and i == 2:
            await resp.write(b"data: {not json\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp
        if what == "error_event" and i == 2:
            await resp.write(b'data: {"error": {"message": "node failed", "code": 503}}\n\n')
            await resp.write(b"data: [DONE]\n\n")
            return resp
        await resp.write(_chunk(tok, chat))
        await asyncio.sleep(0.005)
    usage = {"prompt_tokens": 7, "completion_tokens": len(TOKENS), "total_tokens": 7 + len(TOKENS),
             "prompt_tokens_details": {"cached_tokens": 3}}
    await resp.write(b"data: " + json.dumps({"id": "x", "choices": [], "usage": usage}).encode() + b"\n\n")
    if what != "no_done":
        await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})


@pytest.fixture(scope="module")
def fake_server():
    """Base URL (…/v1) of the fake server, running on its own event loop thread."""
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _completions)
    app.router.add_get("/v1/models", _models)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}/v1"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
