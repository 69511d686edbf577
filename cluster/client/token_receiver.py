"""TokenReceiver: the caller's end of the nodes' token streams, one zmq PULL socket per driver.

Nodes push one msgpack message per engine step per caller (node/streams.py explains why: one Ray
streaming generator per request measured ~20x the CPU per token and +11 ms p50 latency). One
dispatcher task decodes each message and routes its chunks to the per-request TokenStreams opened
here; chunks of requests not open (any more) are dropped.

A TokenStream merges two channels that are not ordered with each other: the tokens (zmq) and the
end of the node's generate() call (Ray), which carries the final chunk and the stream's token count,
and fails at once when the node dies. relay() yields the final chunk only once every token the node
counted arrived, so a caller never sees the end before the last tokens. In PD a third source joins:
the prefill node's early copy of the first token (TokenChunk.early), from another socket and so not
ordered with the decode node's tokens either; whichever copy of the first token comes first is
yielded, the other dropped, so the caller sees every token once and in order.

Every chunk says where its tokens start (TokenChunk.offset). A chunk that starts past the tokens
received means a message was lost on the way (node/streams.py drops a message a caller's queue cannot
hold): the stream yields what is contiguous and ends with an error final, from which the caller
replays; it never yields a hole. A chunk that starts before (a repeat) yields only what is new.

The socket binds once; the dispatcher runs on the event loop of the latest open(), so a driver can
serve one asyncio.run() after another (one loop at a time).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable
from dataclasses import replace
from typing import cast

import ray
import zmq
import zmq.asyncio

from raypd.kvtransfer.data_plane_auth import (
    HandshakeWatch,
    as_server,
    log_refusal,
    process_identity,
    sender_of,
    withdraw,
)
from raypd.kvtransfer.identity import DataPlaneIdentity, PeerKeys
from raypd.protocol.messages import StreamEnd, TokenChunk, unpack_chunks

log = logging.getLogger(__name__)

_ENDED = object()  # queued when the node's generate() call returned or failed


class _NodeLost(str):
    """Queued by TokenReceiver.fail_node(): the caller learnt a node is gone or hung; the reason."""
    node = ""


def merge(chunks: list[TokenChunk]) -> TokenChunk:
    """One chunk carrying every token of `chunks` in order; the last one's ending and metadata."""
    if len(chunks) == 1:
        return chunks[0]
    return replace(chunks[-1], token_ids=tuple(t for c in chunks for t in c.token_ids))


def default_host() -> str:
    """This process's Ray node IP (what other machines reach it by), else loopback."""
    return ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"


class TokenStream:
    """One request's chunks as the dispatcher routes them, until relay() has yielded the final one."""

    def __init__(self, request_id: str, streams: dict[str, TokenStream]):
        self.request_id = request_id
        self.received = 0          # tokens arrived from the node, the final chunk's included
        self.ahead = 0             # of those, how many the prefill node's early copy gave the caller first
        self.node_done = False     # the node's call returned or failed: nothing left to abort there
        self.stream_failed = False  # the error final is this stream's own: the node died, fell silent, lost tokens
        self.node_name = ""        # the node relay() reads from, once it runs
        self.prefill_name = ""     # PD: the node computing the prompt, whose KV this stream waits for
        self.lost_node = ""        # the node fail_node() named, when that ended the stream
        self.gap: tuple[int, int] | None = None  # (first missing token, first token after the hole)
        self._queue: asyncio.Queue = asyncio.Queue()
        self._streams = streams

    def deliver(self, chunk: TokenChunk) -> None:
        self._queue.put_nowait(chunk)

    @property
    def queued(self) -> int:
        """Items delivered that relay() has not taken yet."""
        return self._queue.qsize()

    def close(self) -> None:
        if self._streams.get(self.request_id) is self:
            del self._streams[self.request_id]

    def node_lost(self, reason: str, node: str = "") -> None:
        """End the stream now with an error naming `reason` (relay() yields it as the final chunk),
        held against `node` (lost_node)."""
        lost = _NodeLost(reason)
        lost.node = node
        self._queue.put_nowait(lost)

    async def relay(self, end: Awaitable[StreamEnd], node_name: str, chunk_timeout_s: float,
                    tail_s: float) -> AsyncGenerator[TokenChunk, None]:
        """Yield the request's chunks, coalescing what queued up; the last one, and only it, is final.

        `end` is the node's generate() call. Its StreamEnd gives the final chunk, yielded once
        StreamEnd.num_tokens tokens arrived (waiting up to tail_s for the stragglers; else an error
        final: the stream lost tokens). A node that fails the call, or stays silent for
        chunk_timeout_s, ends the stream with an error final naming it."""
        self.node_name = node_name
        ended = asyncio.ensure_future(end)
        ended.add_done_callback(self._on_end)
        while True:  # tokens until the node's call is over
            try:
                items = await self._take(chunk_timeout_s)
            except asyncio.TimeoutError:
                yield self._error(f"no token from node {node_name} within {chunk_timeout_s:.0f}s")
                return
            if chunk := self._tokens(items):
                yield chunk
            if self.gap is not None:
                yield self._gap_error(node_name)
                return
            if gone := next((i for i in items if isinstance(i, _NodeLost)), None):
                self.lost_node = gone.node
                yield self._error(str(gone))
                return
            if any(i is _ENDED for i in items):
                break
        try:
            result: StreamEnd = ended.result()
        except (ray.exceptions.RayError, asyncio.CancelledError) as e:
            yield self._error(f"node {node_name} failed: {type(e).__name__}")
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + tail_s
        while self.received < result.num_tokens:  # tokens still on their way
            try:
                items = await self._take(max(deadline - loop.time(), 0.0))
            except asyncio.TimeoutError:
                break
            if chunk := self._tokens(items):
                yield chunk
            if self.gap is not None:
                yield self._gap_error(node_name)
                return
        if self.received == result.num_tokens:
            yield self._unseen(result.final, result.num_tokens)
        else:
            lost = result.num_tokens - self.received
            yield replace(self._error(f"the token stream from node {node_name} lost {lost} of "
                                      f"{result.num_tokens} tokens"),
                          num_cached_tokens=result.final.num_cached_tokens, timings=result.final.timings)

    def _on_end(self, fut: asyncio.Future) -> None:
        self.node_done = not fut.cancelled()
        if self.node_done:
            fut.exception()  # retrieved: relay() reads it, if anyone still relays
        self._queue.put_nowait(_ENDED)

    async def _take(self, timeout: float) -> list:
        """Everything queued, waiting up to `timeout` for the first item."""
        q = self._queue
        items = [q.get_nowait() if not q.empty() else await asyncio.wait_for(q.get(), timeout)]
        while not q.empty():
            items.append(q.get_nowait())
        return items

    def _tokens(self, items: list) -> TokenChunk | None:
        """Count the tokens of `items`; the non-final chunks merged, to yield (a final chunk's tokens
        reach the caller in StreamEnd.final). The prefill node's early copy of the first token goes
        out only if the node's own has not come yet; then the node's copy is dropped instead."""
        partial = []
        for c in items:
            if not isinstance(c, TokenChunk):
                continue
            if c.early:   # one token, the first: anything else is not what a prefill node sends
                if not self.received and not self.ahead and len(c.token_ids) == 1:
                    self.ahead = 1
                    partial.append(c)
                continue
            if c.offset > self.received:  # a message was lost: nothing after the hole may go out
                self.gap = (self.received, c.offset)
                break
            if 0 <= c.offset < self.received:  # a repeat of tokens already here: only the rest is new
                c = replace(c, token_ids=c.token_ids[self.received - c.offset:], offset=self.received)
            self.received += len(c.token_ids)
            if not c.finished and (c := self._unseen(c, self.received)).token_ids:
                partial.append(c)
        return merge(partial) if partial else None

    def _gap_error(self, node_name: str) -> TokenChunk:
        first, after = self.gap or (0, 0)
        return self._error(f"the token stream from node {node_name} lost tokens {first}-{after - 1} "
                           f"(a message did not arrive)")

    def _unseen(self, chunk: TokenChunk, end: int) -> TokenChunk:
        """`chunk`, the node's tokens up to its `end`-th, without those the caller already has from
        the early copy."""
        skip = self.ahead - (end - len(chunk.token_ids))
        return replace(chunk, token_ids=chunk.token_ids[skip:]) if skip > 0 else chunk

    def _error(self, error: str) -> TokenChunk:
        self.stream_failed = True
        return TokenChunk(self.request_id, (), finished=True, error=error)


# One message is one engine step's chunks for this caller: far below this. Anything bigger is dropped
# by ZMQ before it is read (it disconnects the sender).
MAX_MESSAGE_BYTES = 8 << 20


class TokenReceiver:
    """The PULL socket admits only the nodes this driver sends requests to (admit(); CURVE:
    kvtransfer/data_plane_auth.py), and its address carries its key (kvtransfer/identity.py)."""

    def __init__(self, host: str | None = None, identity: DataPlaneIdentity | None = None, port: int | None = None):
        # On the process's shared context: a context of its own would be terminated by the garbage
        # collector when a driver is dropped unclosed, and term() can hang there (pyzmq clears the
        # weak references to our socket before the context's __del__ could close it).
        ctx = zmq.asyncio.Context.shadow(zmq.Context.instance())
        # A key of its own: nodes read it from the reply address; nobody needs to derive it. It admits
        # nodes made in this process without an identity (their shared one: nobody else knows it).
        self._identity = identity or DataPlaneIdentity.generate("driver", PeerKeys(process_identity().peers.as_dict()))
        self._sock = as_server(ctx.socket(zmq.PULL), self._identity)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self._watch = HandshakeWatch(self._sock, "token receiver")
        self._watcher: asyncio.Task | None = None
        host = host or default_host()
        if port:  # a fixed port (a firewall lets only it through); else any free one
            self._sock.bind(f"tcp://{host}:{port}")
        else:
            port = self._sock.bind_to_random_port(f"tcp://{host}")
        self.address = self._identity.address(f"tcp://{host}:{port}")
        self._streams: dict[str, TokenStream] = {}
        self._dispatcher: asyncio.Task | None = None
        self.num_messages = 0
        self.num_malformed = 0
        self.num_unattributed = 0  # messages on a connection whose key is no longer admitted here

    def admit(self, node_name: str, public_key: str) -> None:
        """Let `node_name` (its data-plane key, as its NodeHandle carries it) send tokens here: before
        a request goes to it. A key already admitted costs a dictionary lookup."""
        if public_key and self._identity.peers.principal_of(public_key) != node_name:
            self._identity.peers.admit(node_name, public_key)

    def open(self, request_id: str) -> TokenStream:
        """Call on the event loop that will relay the stream, before the node can send to it."""
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already streaming to this driver")
        loop = asyncio.get_running_loop()
        if self._dispatcher is None or self._dispatcher.done() or self._dispatcher.get_loop() is not loop:
            self._dispatcher = loop.create_task(self._dispatch())
            if self._watcher is not None:
                self._watcher.cancel()
            self._watcher = loop.create_task(self._watch_handshakes())
        stream = self._streams[request_id] = TokenStream(request_id, self._streams)
        return stream

    def fail_node(self, node_name: str, reason: str) -> int:
        """End every stream relaying from `node_name`, and every one still waiting for its first token
        from a prompt `node_name` computes (PD), with an error held against it (the caller learnt the
        node is hung or gone, sooner than chunk_timeout_s or the decode side's bootstrap timeout would
        tell); returns how many. On the streams' loop."""
        lost = [s for s in self._streams.values()
                if s.node_name == node_name or (s.prefill_name == node_name and not s.received and not s.ahead)]
        for stream in lost:
            stream.node_lost(reason, node_name)
        return len(lost)

    def close(self) -> None:
        for task in (self._dispatcher, self._watcher):
            if task is not None and not task.done():
                try:
                    task.cancel()
                except RuntimeError:  # its loop is closed: the task is gone with it
                    pass
        self._watch.close()
        withdraw(self._sock.context, self._identity.peers)
        self._sock.close(linger=0)

    async def _watch_handshakes(self) -> None:
        """Log connections refused for want of the secret (a task of its own: off the token path)."""
        monitor = cast(zmq.asyncio.Socket, self._watch.socket)  # made from our asyncio socket: asyncio too
        while True:
            self._watch.note(await monitor.recv_multipart())

    async def _dispatch(self) -> None:
        while True:
            frame = await self._sock.recv(copy=False)
            if sender_of(self._identity.peers, frame) is None:  # admitted at the handshake by another
                self.num_unattributed += 1                        # driver of this process's context
                log_refusal(self.num_unattributed, "dropped a token message from a node not admitted here")
                continue
            data = frame.bytes
            try:
                chunks = unpack_chunks(data)
            except ValueError as e:
                self.num_malformed += 1
                log.error("dropped a malformed token message (%d bytes): %s", len(data), e)
                continue
            self.num_messages += 1
            for chunk in chunks:
                stream = self._streams.get(chunk.request_id)
                if stream is not None:
                    stream.deliver(chunk)
