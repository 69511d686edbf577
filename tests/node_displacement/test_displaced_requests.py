"""Displacement at a full queue on real nodes in this process (the tiny model, the fake transfer
backend, no Ray): a newcomer that ranks before the request that would start last among those waiting
takes its place, and that request ends exactly as a refused one does (OVERLOADED, so the ingress
answers 429 or retries elsewhere), holding nothing on either node.

The case the RequestDriver must get right: a prefill node displaces a request that already waits in
its engine while the decode side holds its KV reservation, so the refusal comes after the caller saw
the request queued. The prefill node's overloaded answer and the decode side's failed room race to the
driver; each order is made certain here (InOrder) and both end the request as refused, blamed on the
prefill node, with the decode side's reservation freed. Queues are filled as in
tests/node/test_node_admission.py: a prefilled request whose KV write the fake backend holds back, a
reservation whose prefill never comes; the mixed node's steps are stopped (StepGate) while it is full,
however fast the tiny model runs.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from types import SimpleNamespace

import pytest

from raypd.cluster.client.node_handles import NodeHandle
from raypd.cluster.client.request_driver import RequestDriver
from raypd.decode_node.decode_node import DecodeNode
from raypd.node.mixed_node import MixedNode
from raypd.prefill_node.prefill_node import PrefillNode
from raypd.prefill_node.prefill_request import PrefillPhase
from raypd.protocol.messages import OVERLOADED, HostInfo, TokenChunk
from raypd.protocol.roles import Role
from raypd.protocol.sampling_params import SamplingParams
from tests.node.pd import (
    GREEDY,
    PATIENT,
    WAIT_S,
    assert_idle,
    prompt,
    request,
    stop_nodes,
    stream_tokens,
    wait_queue,
)

BIG = 600  # tokens = 38 blocks: two do not fit in 64 (decode), one and a 3-block prompt not in 40 (prefill)
URGENT = SamplingParams(max_tokens=6, temperature=0.0, priority=-1)


@pytest.fixture(scope="module")
def nodes(tiny_model_dir):
    # No yielding steps (engine/step_yield.py): the nodes outlive each case, so an earlier case's urgent
    # class is still about in the next, and a yielding prompt's 32-token first chunk (2 blocks) would fit
    # the memory these cases leave a waiting prompt none of.
    options = {"max_waiting_requests": 1, "yield_step_tokens": 0}
    prefill = PrefillNode("dis-prefill", tiny_model_dir, {"num_blocks": 40, **options},
                          transfer_options=PATIENT, aux_slots=4)
    decode = DecodeNode("dis-decode", tiny_model_dir, {"num_blocks": 64, **options},
                        transfer_options=PATIENT, aux_slots=4)
    try:
        yield prefill, decode
    finally:
        stop_nodes(prefill, decode)


@pytest.fixture
def idle_pd(nodes):
    """The PD pair, holding nothing before and after the test (check_idle all zeros on both)."""
    asyncio.run(assert_idle(*nodes))
    yield nodes
    asyncio.run(assert_idle(*nodes))


async def until(predicate: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def in_process(node, **methods: Callable) -> object:
    """`node` as the driver calls an actor: `actor.method.remote(*args)` runs the coroutine method as a
    task of the running loop (what an ObjectRef is to the driver: an awaitable); `methods` replace some."""
    class Actor:
        def __getattr__(self, name: str) -> SimpleNamespace:
            method = methods.get(name) or getattr(node, name)
            return SimpleNamespace(remote=lambda *a: asyncio.ensure_future(method(*a)))
    return Actor()


class InOrder:
    """For each request, `first`'s answer reaches the caller before `second`'s: `second` returns its
    result only once `first` returned for the same request id."""

    def __init__(self, first: Callable, second: Callable):
        self._events: dict[str, asyncio.Event] = {}
        self._first, self._second = first, second

    def _returned(self, rid: str) -> asyncio.Event:
        return self._events.setdefault(rid, asyncio.Event())

    async def first(self, req):
        try:
            return await self._first(req)
        finally:
            self._returned(req.request_id).set()

    async def second(self, req):
        result = await self._second(req)
        await self._returned(req.request_id).wait()
        return result


def handles(nodes, first: str = "") -> tuple[NodeHandle, NodeHandle]:
    """Driver handles on the pair; `first` ("prefill" or "decode"): whose answer comes first, always."""
    prefill, decode = nodes
    methods: tuple[dict, dict] = ({}, {})
    if first == "prefill":
        order = InOrder(prefill.prefill, decode.generate)
        methods = ({"prefill": order.first}, {"generate": order.second})
    elif first == "decode":
        order = InOrder(decode.generate, prefill.prefill)
        methods = ({"prefill": order.second}, {"generate": order.first})
    host = HostInfo("n0", "127.0.0.1", "localhost", 0)
    return (NodeHandle(prefill.name, Role.PREFILL, in_process(prefill, **methods[0]), host, 40,
                       prefill.duty.sender.bootstrap_address),
            NodeHandle(decode.name, Role.DECODE, in_process(decode, **methods[1]), host, 64))


async def chunks_of(driver: RequestDriver, rid: str, ids: Sequence[int], params: SamplingParams,
                    prefill: NodeHandle, decode: NodeHandle) -> list[TokenChunk]:
    """Every chunk the caller sees, the last one final."""
    async def run() -> list[TokenChunk]:
        return [chunk async for chunk in driver.generate(rid, ids, params, prefill, decode)]
    chunks = await asyncio.wait_for(run(), WAIT_S)
    assert chunks[-1].finished and not any(c.finished for c in chunks[:-1]), chunks
    return chunks


def refused_for(chunks: list[TokenChunk], node: str) -> TokenChunk:
    """The request ended as a refusal for capacity by `node`: one OVERLOADED final, no token before it."""
    final = chunks[-1]
    assert len(chunks) == 1 and not final.token_ids, chunks
    assert final.finish_reason == OVERLOADED and final.failed_node == node, final
    assert f"{node} is full: request" in final.error and "took its place" in final.error, final
    return final


def counted(before: dict, after: dict, *keys: str) -> tuple[int, ...]:
    """How much each counter of a node's stats() grew between the two."""
    return tuple(after[k] - before[k] for k in keys)


def served(chunks: list[TokenChunk]) -> list[int]:
    final = chunks[-1]
    assert final.finish_reason in ("stop", "length") and not final.error, final
    tokens = [t for c in chunks for t in c.token_ids]
    assert tokens, chunks
    return tokens


@pytest.mark.parametrize("first", ["prefill", "decode"])
def test_a_request_displaced_from_the_prefill_queue_after_queueing_ends_as_refused(idle_pd, sink, first):
    """`victim` waits in the prefill engine (no memory beside `big`, whose KV write is held) while its
    decode side holds its reservation; a more urgent `newcomer` takes its place. Whichever of the prefill
    node's answer and the decode side's failed room reaches the driver first, `victim` ends as refused
    by the prefill node, both nodes have let go of it, and `newcomer` is served."""
    prefill, decode = idle_pd
    p, d = handles(idle_pd, first)
    backend = prefill.duty.sender.backend
    big = request(prompt(BIG, 30000), GREEDY, prefill.duty.sender.bootstrap_address, sink.address)
    # Ids of their own per case: the nodes outlive the case, and each remembers the aborts the driver
    # sent after a request ended (node/early_aborts.py), which a reused id would meet.
    victim_id, newcomer_id = f"victim-{first}", f"newcomer-{first}"

    def queued_with_destination() -> bool:   # engine thread: waits in the engine, decode side's blocks known
        pr = prefill.duty.requests.get(victim_id)
        return pr is not None and pr.phase == PrefillPhase.WAITING and prefill.core.engine.num_backlogged() == 1 \
            and prefill.duty.sender.destination(pr.room) is not None

    def holds_victim() -> tuple[bool, bool, bool]:
        return (victim_id in prefill.duty.requests, victim_id in decode.duty.requests,
                victim_id in decode.core.engine.reservations)

    async def main():
        before = await prefill.stats()
        with RequestDriver(reply_host="127.0.0.1") as driver:
            backend.hold_writes = True  # type: ignore[attr-defined]  # the fake backend's switch
            try:
                big_calls = [asyncio.ensure_future(prefill.prefill(big)), asyncio.ensure_future(decode.generate(big))]
                await wait_queue(prefill, "inflight", 1)
                victim = asyncio.ensure_future(chunks_of(driver, victim_id, prompt(40, 40000), GREEDY, p, d))
                await until(lambda: prefill.core.call(queued_with_destination), "victim queued, its destination sent")
                newcomer = asyncio.ensure_future(chunks_of(driver, newcomer_id, prompt(20, 45000), URGENT, p, d))
                victim_chunks = await victim
                held = (await prefill.core.call(holds_victim)) + await decode.core.call(holds_victim)
            finally:
                backend.hold_writes = False  # type: ignore[attr-defined]
                backend.complete_held()  # type: ignore[attr-defined]
            newcomer_chunks = await newcomer
            big_result, big_end = await asyncio.gather(*big_calls)
        counts = counted(before, await prefill.stats(), "displaced", "refused", "failed")
        return victim_chunks, held, newcomer_chunks, big_result, big_end, counts
    victim_chunks, held, newcomer_chunks, big_result, big_end, counts = asyncio.run(main())
    refused_for(victim_chunks, "dis-prefill")
    assert held == (False,) * 6, held  # neither node holds anything of it once the caller has its end
    served(newcomer_chunks)
    assert big_result.ok and stream_tokens(sink, big_end)
    assert counts == (1, 1, 0)  # a refusal, not a failed prefill


def test_a_request_waiting_for_kv_memory_is_displaced_by_a_more_urgent_one_and_a_tie_is_refused(
        idle_pd, sink, monkeypatch):
    """The decode node's one waiting place is `blocked`'s (no memory beside `big`'s reservation, whose
    prefill never comes): a newcomer of its priority is refused at once, a more urgent one takes its
    place; `blocked` ends as refused by the decode node and its prefill side is freed. The prefill node
    runs no step until `blocked` has its end: `blocked` fits its pool, so computed early its first token
    could reach the caller before the displacement (a race the machine's load decided, once in a suite)."""
    prefill, decode = idle_pd
    p, d = handles(idle_pd)
    gate = StepGate(prefill.core.engine, waiting=0)
    monkeypatch.setattr(prefill.core.engine, "step", gate)
    address = prefill.duty.sender.bootstrap_address
    big, tie = (request(prompt(n, start), GREEDY, address, sink.address) for n, start in ((BIG, 10000), (20, 3000)))

    async def main():
        before = await decode.stats()
        with RequestDriver(reply_host="127.0.0.1") as driver:
            big_end = asyncio.ensure_future(decode.generate(big))
            await wait_queue(decode, "transfer", 1)
            blocked = asyncio.ensure_future(chunks_of(driver, "blocked", prompt(BIG, 20000), GREEDY, p, d))
            await until(lambda: decode.core.call(lambda: decode.duty.prealloc.num_blocked == 1),
                        "a tick to find no memory for blocked")
            tie_end = await decode.generate(tie)
            newcomer = asyncio.ensure_future(chunks_of(driver, "urgent", prompt(20, 5000), URGENT, p, d))
            blocked_chunks = await blocked
            held = await prefill.core.call(lambda: "blocked" in prefill.duty.requests)
            gate.open()
            newcomer_chunks = await newcomer
            await decode.abort(big.request_id)
            counts = counted(before, await decode.stats(), "displaced", "refused")
            return tie_end, newcomer_chunks, blocked_chunks, held, await big_end, counts
    tie_end, newcomer_chunks, blocked_chunks, held, big_end, counts = asyncio.run(main())
    tie_final = sink.chunks(tie.request_id)
    assert tie_final == [tie_end.final] and tie_end.final.finish_reason == OVERLOADED
    assert "dis-decode is full: 1 requests already wait for KV memory" in tie_end.final.error
    served(newcomer_chunks)
    refused_for(blocked_chunks, "dis-decode")
    assert not held  # its prefill side was aborted before the caller got its end
    assert big_end.final.finish_reason == "abort"
    sink.chunks(big.request_id)
    assert counts == (1, 2)


class StepGate:
    """engine.step until a step leaves `waiting` requests waiting; from then on no step runs (each
    returns nothing) until open(): the node stays as that step left it, however fast the model is."""

    def __init__(self, engine, waiting: int):
        self._engine, self._step, self._waiting = engine, engine.step, waiting
        self._open = threading.Event()
        self.closed = False

    def __call__(self):
        if self.closed and not self._open.is_set():
            time.sleep(0.001)
            return []
        outputs = self._step()
        self.closed = not self._open.is_set() and self._engine.num_backlogged() >= self._waiting
        return outputs

    def open(self) -> None:
        self._open.set()


def test_a_tenant_below_its_share_displaces_the_floods_newest_waiting_request_on_a_mixed_node(
        tiny_model_dir, sink, monkeypatch):
    """A mixed node runs one flood request with two more waiting (its bound): another flood request is
    refused at once; a request of a tenant with nothing there (ranked at the flood's counter, with fewer
    in line) takes the place of the flood's newest. The displaced one ends refused, the others are
    served, and the node holds nothing at the end."""
    mixed = MixedNode("dis-mixed", tiny_model_dir, {"num_blocks": 64, "max_running_requests": 1,
                                                    "max_waiting_requests": 2})
    gate = StepGate(mixed.core.engine, waiting=2)
    monkeypatch.setattr(mixed.core.engine, "step", gate)
    flood = SamplingParams(max_tokens=6, temperature=0.0, tenant="flood")
    running = request(prompt(12, 900), SamplingParams(max_tokens=600, temperature=0.0, ignore_eos=True,
                                                      tenant="flood"), reply_address=sink.address)
    first, last, tie = (request(prompt(12, start), flood, reply_address=sink.address) for start in (1000, 1100, 1200))
    web = request(prompt(12, 1300), SamplingParams(max_tokens=6, temperature=0.0, tenant="web"),
                  reply_address=sink.address)

    async def main():
        try:
            ends = [asyncio.ensure_future(mixed.generate(r)) for r in (running, first, last)]
            await until(lambda: mixed.core.call(lambda: gate.closed), "a step to leave two waiting")
            tie_end = await mixed.generate(tie)
            web_end = asyncio.ensure_future(mixed.generate(web))
            last_end = await ends[2]
            gate.open()
            await mixed.abort(running.request_id)
            results = await asyncio.gather(ends[0], ends[1], web_end)
            return tie_end, last_end, results, await mixed.check_idle(), await mixed.stats()
        finally:
            await mixed.shutdown()
    tie_end, last_end, (running_end, first_end, web_end), idle, stats = asyncio.run(main())
    assert [c.finish_reason for c in sink.chunks(tie.request_id)] == [OVERLOADED]
    assert "dis-mixed is full: 2 requests already wait to run" in tie_end.final.error
    assert sink.chunks(last.request_id) == [last_end.final] and last_end.final.finish_reason == OVERLOADED
    assert f"request {web.request_id!r} ranks before this one" in last_end.final.error
    assert running_end.final.finish_reason == "abort"
    sink.chunks(running.request_id)
    assert stream_tokens(sink, first_end) and stream_tokens(sink, web_end)
    assert not any(idle.values()) and stats["held_blocks"] == 0, (idle, stats)
    assert (stats["displaced"], stats["refused"]) == (1, 2)
