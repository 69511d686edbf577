"""What the PD node tests share: engine and transfer options, request builders, a token sink, waits.

Everything runs in this process with the fake transfer backend (torch copies between pools, real
ZMQ bootstrap sockets on 127.0.0.1) and no Ray. Every wait has a bound; none asserts speed.
"""
from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

import zmq

from raypd.kvtransfer import TransferConfig
from raypd.kvtransfer.data_plane_auth import as_server, process_identity, process_secret
from raypd.kvtransfer.identity import DataPlaneIdentity
from raypd.protocol.messages import NodeRequest, StreamEnd, TokenChunk, unpack_chunks
from raypd.protocol.sampling_params import SamplingParams

# 16 blocks of 16 tokens, prefill chunks of 16 tokens: a 40-token prompt takes three steps.
ENGINE = {"num_blocks": 16, "chunked_prefill_size": 16, "max_num_batched_tokens": 16}
# Nothing times out unless a test means it to; heartbeats are generous for a busy 2-core machine.
PATIENT = {"backend": "fake", "bootstrap_timeout_s": 60.0, "wait_timeout_s": 60.0, "transfer_timeout_s": 60.0,
           "heartbeat_interval_s": 0.2, "heartbeat_timeout_s": 60.0}
GREEDY = SamplingParams(max_tokens=6, temperature=0.0)
ENDLESS = SamplingParams(max_tokens=150, temperature=0.0, ignore_eos=True)
WAIT_S = 20.0  # bound on any one wait: a hang, not a slow machine, fails a test

_rooms = itertools.count(1000)
_ids = itertools.count()


def config(**changes) -> TransferConfig:
    return TransferConfig(**{**PATIENT, **changes})


def prompt(n: int, start: int = 1000) -> tuple[int, ...]:
    """n token ids (any ids do: both sides and the reference see the same)."""
    return tuple(range(start, start + n))


def request(ids: Sequence[int], params: SamplingParams = GREEDY, bootstrap_address: str = "",
            reply_address: str = "") -> NodeRequest:
    return NodeRequest(f"r{next(_ids)}", next(_rooms), tuple(ids), params, bootstrap_address, reply_address)


def wait_until(predicate: Callable[[], object], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def stream_tokens(sink: TokenSink, end: StreamEnd) -> list[int]:
    """The tokens the request's stream carried: exactly one final chunk, equal to generate()'s."""
    chunks = sink.chunks(end.final.request_id)
    assert sum(c.finished for c in chunks) == 1 and chunks[-1] == end.final
    out = [t for c in chunks for t in c.token_ids]
    assert len(out) == end.num_tokens
    return out


class RecordingConductor:
    """What a ConductorLink calls on the Conductor when its node fails: here only mark_dead is expected."""

    def __init__(self):
        self.dead: list[tuple[str, str]] = []

        class MarkDead:
            @staticmethod
            def remote(name, reason):
                self.dead.append((name, reason))
        self.mark_dead = MarkDead()


# The node names a NodeCluster started in a test process may give (NodeCluster numbers each role).
CLUSTER_NODE_NAMES = [f"raypd-{role}-{i}" for role in ("prefill", "decode", "mixed", "flex") for i in range(16)]


class TokenSink:
    """The caller's end of the token streams: a zmq PULL socket whose (keyed) address goes in
    NodeRequest.reply_address. It admits what a driver would: nodes built in this process (their
    shared identity, data_plane_auth.process_identity), and the nodes of a NodeCluster started in this
    process, whose keys derive from this process's secret and their names."""

    def __init__(self) -> None:
        shared = process_identity()
        identity = DataPlaneIdentity.generate("token-sink")
        identity.peers.admit_all({**shared.peers.as_dict(),
                                  **{n: process_secret().public_key_of(n) for n in CLUSTER_NODE_NAMES}})
        self._sock = as_server(zmq.Context.instance().socket(zmq.PULL), identity)
        self._sock.setsockopt(zmq.LINGER, 0)
        self.address = identity.address(f"tcp://127.0.0.1:{self._sock.bind_to_random_port('tcp://127.0.0.1')}")
        self._chunks: dict[str, list[TokenChunk]] = defaultdict(list)

    def chunks(self, request_id: str, timeout_s: float = WAIT_S) -> list[TokenChunk]:
        """The request's chunks up to and including its final one."""
        return self._until(request_id, lambda got: bool(got) and got[-1].finished, "no final chunk", timeout_s)

    def take(self, request_id: str, at_least: int, timeout_s: float = WAIT_S) -> list[TokenChunk]:
        """The request's chunks so far, once at least `at_least` came (taken: chunks() returns the rest)."""
        return self._until(request_id, lambda got: len(got) >= at_least, f"fewer than {at_least} chunks", timeout_s)

    def _until(self, request_id: str, done: Callable[[list[TokenChunk]], bool], failure: str,
               timeout_s: float) -> list[TokenChunk]:
        deadline = time.monotonic() + timeout_s
        while not done(self._chunks[request_id]):
            left_ms = (deadline - time.monotonic()) * 1e3
            if left_ms <= 0 or not self._sock.poll(left_ms):
                raise AssertionError(f"{request_id}: {failure} within {timeout_s:.0f}s")
            for chunk in unpack_chunks(self._sock.recv()):
                self._chunks[chunk.request_id].append(chunk)
        return self._chunks.pop(request_id)

    def close(self) -> None:
        self._sock.close()


async def wait_queue(node, queue: str, n: int, timeout_s: float = WAIT_S) -> None:
    """Until node.stats()["queues"][queue] == n."""
    deadline = time.monotonic() + timeout_s
    while (await node.stats())["queues"][queue] != n:
        if time.monotonic() > deadline:
            raise AssertionError(f"{node.name}: queue {queue!r} never held {n}: {(await node.stats())['queues']}")
        await asyncio.sleep(0.005)


PREFILL_QUEUES = ("bootstrap", "queued", "inflight")


async def wait_held(node, n: int, queues: Sequence[str] = PREFILL_QUEUES, timeout_s: float = WAIT_S) -> None:
    """Until the node's prefill stages hold n requests between them. A request without a decode side
    yet may wait in any: computed early with its write armed, or waiting for its destination."""
    deadline = time.monotonic() + timeout_s
    async def held() -> int:
        queues_now = (await node.stats())["queues"]
        return sum(queues_now[q] for q in queues)
    while await held() != n:
        if time.monotonic() > deadline:
            raise AssertionError(f"{node.name}: never held {n}: {(await node.stats())['queues']}")
        await asyncio.sleep(0.005)


def stop_nodes(*nodes) -> None:
    """Shut the nodes down, in order (a module fixture's teardown)."""
    async def stop():
        for node in nodes:
            await node.shutdown()
    asyncio.run(stop())


async def assert_idle(*nodes, timeout_s: float = WAIT_S) -> None:
    """Every node's block accounting adds up (check_idle asserts it on the engine thread) and it holds
    nothing: check_idle() all zeros, no block held, every block free or evictable. Waits for endings
    still on their way (a peer's confirmation)."""
    deadline = time.monotonic() + timeout_s
    for node in nodes:
        while any((idle := await node.check_idle()).values()):
            if time.monotonic() > deadline:
                raise AssertionError(f"{node.name} still holds {idle}")
            await asyncio.sleep(0.01)
        stats, load = await node.stats(), await node.load_report()
        assert stats["held_blocks"] == 0 and stats["reservations"] == 0, stats
        assert load.free_blocks == load.total_blocks == stats["num_blocks"], load
        assert not any(stats["queues"].values()), stats["queues"]
