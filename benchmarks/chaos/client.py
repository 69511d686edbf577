"""One streamed request through the official openai client (AsyncOpenAI, no retries), timed as its
chunks arrive, with a failure classified by what the client saw:

    timeout        no complete answer within the request's timeout (ours or the client's)
    connection     no connection, or it broke mid-stream (refused, reset, truncated body)
    http_<code>    the server answered with that status before the stream began (503, 429, 500, ...)
    stream_error   an error event inside a stream that had started
    incomplete     the stream ended without a finish_reason (no error, no [DONE] in the right place)
    client_error   anything else the client raised (its type is in the detail)
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from raypd.benchmarks.chaos.workload import ChaosRequest


@dataclass(slots=True)
class Outcome:
    """What one request gave; times in seconds from the send."""
    reason: str | None = None   # None = ok; else one of the classes above
    detail: str = ""
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    response_id: str = ""       # the server's id of the response (raypd: the request id its routes carry)
    chunk_s: list[float] = field(default_factory=list)   # when each piece of text arrived, from the send
    ended_s: float | None = None  # when it ended, from the send, however it ended

    @property
    def ok(self) -> bool:
        return self.reason is None

    @property
    def tpot_s(self) -> float | None:
        n = self.completion_tokens
        if not self.ok or self.ttft_s is None or self.e2e_s is None or n is None or n < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (n - 1)

    def same_output(self, other: Outcome) -> bool:
        return self.text == other.text and self.finish_reason == other.finish_reason


def failure_reason(exc: BaseException) -> tuple[str, str]:
    """(class, detail) of an exception the openai client raised while sending or streaming."""
    import openai

    detail = f"{type(exc).__name__}: {exc}"[:300]
    if isinstance(exc, (openai.APITimeoutError, asyncio.TimeoutError, TimeoutError)):
        return "timeout", detail
    if isinstance(exc, openai.APIConnectionError):
        return "connection", detail
    if isinstance(exc, openai.APIStatusError):
        return f"http_{exc.status_code}", detail
    if isinstance(exc, openai.APIError):  # the client raises a bare APIError for an in-stream error event
        return "stream_error", detail
    return "client_error", detail


async def stream_one(client, model: str, req: ChaosRequest, timeout_s: float) -> Outcome:
    """Send `req` and read its stream to the end; never raises (except cancellation)."""
    out = Outcome()
    sent = time.perf_counter()
    try:
        await asyncio.wait_for(_stream(client, model, req, out, sent), timeout_s)
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - every failure is a result to count, not a crash
        out.reason, out.detail = failure_reason(e)
        out.ended_s = time.perf_counter() - sent
        return out
    out.e2e_s = out.ended_s = time.perf_counter() - sent
    if out.finish_reason is None:
        out.reason, out.detail = "incomplete", "the stream ended without a finish_reason"
    return out


async def _stream(client, model: str, req: ChaosRequest, out: Outcome, sent: float) -> None:
    create = client.chat.completions.create if req.endpoint == "chat" else client.completions.create
    stream = await create(**req.create_kwargs(model))
    try:
        async for chunk in stream:
            out.response_id = out.response_id or (chunk.id or "")
            if chunk.usage is not None:
                out.completion_tokens = chunk.usage.completion_tokens
            for choice in chunk.choices:
                piece = choice.delta.content if req.endpoint == "chat" else choice.text
                if piece:
                    out.chunk_s.append(time.perf_counter() - sent)
                    if out.ttft_s is None:
                        out.ttft_s = out.chunk_s[0]
                    out.text += piece
                if choice.finish_reason:
                    out.finish_reason = choice.finish_reason
    finally:
        await stream.close()
