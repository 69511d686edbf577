"""A fake raypd endpoint on 127.0.0.1, on its own event-loop thread: streaming chat and completions
whose prompt (or last message) names what to do, `/health/ready` and `/admin/nodes` answering
whatever the test puts in `server.state`. No process is started."""
from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field

import pytest
from aiohttp import web

WORDS = ["The", " quick", " brown", " fox", "."]


def _chunk(text: str, chat: bool, finish: str | None = None) -> bytes:
    choice: dict = {"index": 0, "finish_reason": finish}
    if chat:
        choice["delta"] = {"content": text}
    else:
        choice |= {"text": text, "logprobs": None}
    obj = {"id": "x", "object": "chat.completion.chunk" if chat else "text_completion", "created": 0,
           "model": "fake-model", "choices": [choice]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


@dataclass
class FakeServer:
    base: str = ""
    state: dict = field(default_factory=dict)   # "ready": (status, body), "nodes": body
    bodies: list = field(default_factory=list)  # every request body received

    @property
    def v1(self) -> str:
        return self.base + "/v1"


def _app(server: FakeServer) -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        server.bodies.append(body)
        chat = "messages" in body
        what = body["messages"][-1]["content"] if chat else body["prompt"]
        if what.startswith("status "):
            code = int(what.split()[1])
            return web.json_response({"error": {"message": "no", "type": "x", "code": code}}, status=code)
        if what == "slow":
            await asyncio.sleep(1.5)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, word in enumerate(WORDS):
            if what == "drop" and i == 2:
                assert request.transport is not None
                request.transport.close()
                return resp
            if what == "error_event" and i == 2:
                await resp.write(b'data: {"error": {"message": "node failed", "code": 503}}\n\n')
                return resp
            last = i == len(WORDS) - 1 and what != "no_finish"
            await resp.write(_chunk(word + (f" [{what}]" if i == 0 else ""), chat, "length" if last else None))
        usage = {"prompt_tokens": 7, "completion_tokens": len(WORDS), "total_tokens": 7 + len(WORDS)}
        await resp.write(b"data: " + json.dumps({"id": "x", "object": "chat.completion.chunk", "created": 0,
                                                 "model": "fake-model", "choices": [], "usage": usage}).encode()
                         + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model", "created": 0,
                                                             "owned_by": "raypd"}]})

    async def ready(request: web.Request) -> web.Response:
        if "ready" not in server.state:
            return web.json_response({"error": {"message": "no route"}}, status=404)
        status, body = server.state["ready"]
        return web.json_response(body, status=status)

    async def nodes(request: web.Request) -> web.Response:
        return web.json_response(server.state.get("nodes", {"nodes": []}))

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health/ready", ready)
    app.router.add_get("/health", health)
    app.router.add_get("/admin/nodes", nodes)
    return app


@pytest.fixture
def server():
    fake = FakeServer()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(_app(fake))
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    fake.base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield fake
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
