"""One streamed request over HTTP (aiohttp), timing every chunk as its bytes arrive.

A request that does not end with a complete stream is an error of one kind:
    connect       no connection (refused, reset before a response)
    http_<code>   a non-200 status
    stream_error  an error event inside the stream
    malformed     a payload that is not a chunk object
    disconnected  the body ended before `data: [DONE]`
    timeout       the request took longer than its timeout
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import aiohttp

from raypd.benchmarks.serve.datasets import Request
from raypd.benchmarks.serve.sse import DONE, MalformedSSE, SSEParser, parse_chunk


@dataclass(slots=True)
class Result:
    """What one request measured; times in seconds, `start_s` from the start of the run."""
    start_s: float = 0.0
    error: str | None = None
    detail: str = ""
    ttft_s: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # each text chunk's arrival, from the send
    e2e_s: float | None = None
    text: str = ""
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    max_tokens: int = 0
    turn: int = 1  # the request's place in its session: a conversation's turn (runner.py sets it)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def itl_s(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.e2e_s is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


def request_body(req: Request, model: str, extra: dict) -> dict:
    body = {"model": model, "max_tokens": req.max_tokens, "temperature": 0.0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, **extra}
    if req.chat:
        body["messages"] = req.messages
    else:
        body["prompt"] = req.prompt
    return body


async def send(http: aiohttp.ClientSession, base_url: str, req: Request, model: str, extra: dict,
               timeout_s: float, t0: float, headers: dict | None = None, into: Result | None = None) -> Result:
    """into: the Result to fill, so that a caller that cancels the call keeps what it measured (a TTFT)."""
    url = base_url.rstrip("/") + ("/chat/completions" if req.chat else "/completions")
    res = into if into is not None else Result()
    res.max_tokens = req.max_tokens
    sent = time.perf_counter()
    res.start_s = sent - t0
    try:
        await asyncio.wait_for(_stream(http, url, request_body(req, model, extra), headers or {}, res, sent), timeout_s)
    except asyncio.TimeoutError:
        res.error, res.detail = "timeout", f"after {timeout_s:.0f}s"
    except aiohttp.ClientConnectorError as e:
        res.error, res.detail = "connect", str(e)
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, ConnectionResetError) as e:
        res.error, res.detail = "disconnected", type(e).__name__
    except aiohttp.ClientError as e:
        res.error, res.detail = "connect", f"{type(e).__name__}: {e}"
    return res


async def _stream(http: aiohttp.ClientSession, url: str, body: dict, headers: dict, res: Result, sent: float) -> None:
    async with http.post(url, json=body, headers=headers) as resp:
        if resp.status != 200:
            res.error, res.detail = f"http_{resp.status}", (await resp.text())[:200]
            return
        parser, done = SSEParser(), False
        async for raw in resp.content.iter_any():
            now = time.perf_counter() - sent
            for payload in parser.feed(raw):
                if payload.strip() == DONE:
                    done = True
                    continue
                try:
                    chunk = parse_chunk(payload)
                except MalformedSSE as e:
                    res.error, res.detail = "malformed", str(e)
                    return
                if chunk.error is not None:
                    res.error, res.detail = "stream_error", chunk.error
                    return
                if chunk.text:
                    if res.ttft_s is None:
                        res.ttft_s = now
                    res.chunk_times.append(now)
                    res.text += chunk.text
                _read_usage(res, chunk.usage, chunk.cache_n)
        res.e2e_s = time.perf_counter() - sent
        if not done:
            res.error, res.detail = "disconnected", "stream ended before [DONE]"


def _read_usage(res: Result, usage: dict | None, cache_n: int | None) -> None:
    if cache_n is not None and res.cached_tokens is None:
        res.cached_tokens = int(cache_n)
    if not usage:
        return
    if isinstance(usage.get("prompt_tokens"), int):
        res.prompt_tokens = usage["prompt_tokens"]
    if isinstance(usage.get("completion_tokens"), int):
        res.output_tokens = usage["completion_tokens"]
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        res.cached_tokens = details["cached_tokens"]
