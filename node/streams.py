"""StreamHub: per-request token streams from the engine thread to the actor's asyncio callers.

The engine thread pushes one TokenChunk per request per step with `push()` (thread-safe, never
blocks). The caller's async generator (a Ray streaming generator method) drains everything queued
since its last yield into one chunk, so a slow consumer costs fewer, larger messages instead of a
growing backlog. benchmarks/streaming_overhead.py measured this path against pyzmq PUSH.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import replace

from node.messages import TokenChunk


def merge(chunks: list[TokenChunk]) -> TokenChunk:
    """One chunk carrying every token of `chunks` in order; the last one's ending and metadata."""
    if len(chunks) == 1:
        return chunks[0]
    tokens = tuple(t for c in chunks for t in c.token_ids)
    return replace(chunks[-1], token_ids=tokens)


class StreamHub:
    def __init__(self):
        self._lock = threading.Lock()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}

    def open(self, request_id: str) -> asyncio.Queue:
        """Call on the event loop that will read the stream."""
        q: asyncio.Queue = asyncio.Queue()
        with self._lock:
            if request_id in self._streams:
                raise ValueError(f"request id {request_id!r} is already streaming on this node")
            self._streams[request_id] = (asyncio.get_running_loop(), q)
        return q

    def push(self, chunk: TokenChunk) -> None:
        """From any thread. Chunks for a stream nobody reads any more are dropped."""
        with self._lock:
            entry = self._streams.get(chunk.request_id)
        if entry is not None:
            loop, q = entry
            try:
                loop.call_soon_threadsafe(q.put_nowait, chunk)
            except RuntimeError:  # the event loop is closed: the actor is going away
                pass

    def close(self, request_id: str) -> None:
        with self._lock:
            self._streams.pop(request_id, None)

    def open_ids(self) -> list[str]:
        with self._lock:
            return list(self._streams)

    @staticmethod
    async def read(q: asyncio.Queue) -> AsyncIterator[TokenChunk]:
        """Yield coalesced chunks until the final one."""
        while True:
            chunks = [await q.get()]
            while not q.empty() and not chunks[-1].finished:
                chunks.append(q.get_nowait())
            chunk = merge(chunks)
            yield chunk
            if chunk.finished:
                return


class Reply:
    """A one-shot answer set from the engine thread and awaited on the event loop."""

    def __init__(self):
        self._loop = asyncio.get_running_loop()
        self._future: asyncio.Future = self._loop.create_future()

    def set(self, value) -> None:
        def _set():
            if not self._future.done():
                self._future.set_result(value)
        try:
            self._loop.call_soon_threadsafe(_set)
        except RuntimeError:
            pass

    async def wait(self, timeout: float | None = None):
        return await asyncio.wait_for(asyncio.shield(self._future), timeout)
