"""NodeBase: what every node actor (prefill, decode, mixed) is made of.

An LLMEngine owned by an EngineLoop thread, TokenStreams to callers (pyzmq, flushed after every tick
and every step), a buffer of the engine's KV events, and the Ray-callable methods every role shares:
ready(), load_report(), stats(), drain_kv_events(), check_idle(), shutdown(). The role classes add
their request path and queues; _stream_request() is the generate() of the roles that stream tokens.
Node classes are plain Python; the launcher wraps them with ray.remote and resource options.
"""
from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable

from raypd.engine.engine import LLMEngine
from raypd.kvtransfer.config import TransferConfig
from raypd.engine.outputs import StepOutput
from raypd.node.engine_loop import EngineLoop
from raypd.node.host import host_info
from raypd.node.node_metrics import NodeMetrics
from raypd.protocol.messages import KVEventBatch, LoadReport, NodeRequest, StreamEnd, TokenChunk
from raypd.node.streams import Reply, TokenStreams

log = logging.getLogger(__name__)


class NodeBase(ABC):
    role = "node"

    def __init__(self, name: str, model: str | None = None, engine_options: dict | None = None,
                 num_cpus: float = 1.0):
        options = dict(engine_options or {})
        # Pin torch to the cores Ray gave this actor: more threads than cores only thrash.
        options.setdefault("num_threads", max(1, int(num_cpus)))
        self.name = name
        self._kv_events: deque = deque()
        self.engine = LLMEngine(model, on_kv_event=self._kv_events.append, **options)
        self.streams = TokenStreams()
        self.loop = EngineLoop(self.engine, self._tick_and_flush, self._outputs_and_flush, self._on_crash, name)
        self.host = host_info()
        self.started_at = time.time()
        self._conductor_link = None
        self.metrics = NodeMetrics()  # no-op outside Ray

    def _transfer_config(self, options: dict | None) -> TransferConfig:
        """The node's kvtransfer options; sockets bind to the node's own IP unless told otherwise, so
        peers on other machines reach them (loopback would only serve one box)."""
        return TransferConfig(**{"host": self.host.ip, **(options or {})})

    # -- Ray-callable, every role -------------------------------------------------------------------
    async def ready(self) -> dict:
        """Identity and shape; the launcher waits on it, so it also proves the engine loaded."""
        return {"name": self.name, "role": self.role, "host": self.host, "num_blocks": self.engine.num_blocks,
                "block_size": self.engine.config.block_size, **self._extra_info()}

    async def load_report(self) -> LoadReport:
        return await self.loop.acall(self._load_report)

    async def stats(self) -> dict:
        return await self.loop.acall(self._stats)

    async def drain_kv_events(self) -> KVEventBatch:
        return await self.loop.acall(self._drain_kv_events)

    async def kv_snapshot(self) -> tuple[int, list]:
        """(last KV event seq, BlockStored per cached block): for a Conductor re-sync after a gap.
        Events still buffered are dropped: the snapshot supersedes them."""
        return await self.loop.acall(self._kv_snapshot)

    async def check_idle(self) -> dict:
        """Assert the engine's block accounting adds up; report what is still held (tests want zeros)."""
        return await self.loop.acall(self._check_idle)

    async def attach_conductor(self, conductor) -> None:
        """Register with the Conductor, then keep it informed: KV events, load reports (heartbeats)."""
        import ray

        from raypd.node.conductor_link import ConductorLink

        if self._conductor_link is not None:
            self._conductor_link.stop()
        self._conductor_link = ConductorLink(self, conductor, ray.get_runtime_context().current_actor)
        await self._conductor_link.register()
        self._conductor_link.start()

    async def shutdown(self) -> None:
        if self._conductor_link is not None:
            self._conductor_link.stop()
        self.loop.stop()
        if not self.loop.running:  # the sockets belong to the engine thread while it runs
            self.streams.close()
        self._close()

    async def _stream_request(self, req: NodeRequest, add: Callable[[NodeRequest], None],
                              abort: Callable[[str], None]) -> StreamEnd:
        """Open the request's token stream to req.reply_address, add(req) on the engine thread, and
        return once the request ended, however it ended. Cancelling the call aborts the request."""
        reply = Reply()
        try:
            await self.loop.acall(self._open_stream, req, reply, add)
            return await reply.wait()
        except asyncio.CancelledError:
            self.loop.call(abort, req.request_id)
            raise

    # -- engine thread ------------------------------------------------------------------------------
    def _load_report(self) -> LoadReport:
        eng = self.engine
        sched = eng.scheduler
        queued = sum(r.num_prompt_tokens - min(r.num_computed_tokens, r.num_prompt_tokens)
                     for r in list(sched.waiting) + sched.running) + self._queued_outside_engine()
        report = LoadReport(
            node_name=self.name, role=self.role, queued_prefill_tokens=queued,
            waiting=len(sched.waiting) + self._waiting_outside_engine(), running=len(sched.running),
            free_blocks=eng.allocator.num_free + eng.prefix_cache.num_evictable_blocks,
            total_blocks=eng.num_blocks, cached_blocks=eng.prefix_cache.num_cached_blocks,
            inflight=self._inflight(), step_time_s=self.loop.step_time_s,
            prefill_tokens_per_s=self.loop.tokens_per_s, timestamp=time.time())
        self.metrics.observe(report, self._extra_stats())
        return report

    def _stats(self) -> dict:
        return {"name": self.name, "role": self.role, **self.engine.stats(),
                "stream_messages": self.streams.num_messages, "stream_dropped": self.streams.num_dropped,
                **self._extra_stats()}

    def _drain_kv_events(self) -> KVEventBatch:
        events = tuple(self._kv_events)
        self._kv_events.clear()
        return KVEventBatch(self.name, events)

    def _kv_snapshot(self) -> tuple[int, list]:
        self._kv_events.clear()
        return self.engine.prefix_cache.snapshot()

    def _open_stream(self, req: NodeRequest, reply: Reply, add: Callable[[NodeRequest], None]) -> None:
        if not self.streams.open(req.request_id, req.reply_address, reply):
            return
        try:
            add(req)
        except Exception as e:  # a bug, not a bad request: still end the stream, so the caller hears
            log.exception("adding request %s failed", req.request_id)
            self.streams.push(TokenChunk(req.request_id, (), finished=True, error=f"node {self.name}: {e!r}"))

    def _tick_and_flush(self) -> bool:
        busy = self._tick()
        self.streams.flush()  # what the calls and the tick produced: final chunks, first tokens
        return busy

    def _outputs_and_flush(self, outputs: list[StepOutput]) -> None:
        self._on_outputs(outputs)
        self.streams.flush()  # one message per caller per step

    def _check_idle(self) -> dict:
        self.engine.check_block_integrity()
        return {"requests": len(self.engine.requests), "reservations": len(self.engine.reservations),
                "streams": len(self.streams.open_ids()), **self._extra_idle()}

    def _on_crash(self, e: BaseException) -> None:
        self.streams.end_all(f"node {self.name} crashed: {e!r}")

    # -- what roles override --------------------------------------------------------------------------
    def _tick(self) -> bool:
        """Advance the role's own queues; True while transfers are in flight (poll soon)."""
        return False

    @abstractmethod
    def _on_outputs(self, outputs: list[StepOutput]) -> None:
        """Deliver one step's outputs (runs on the engine thread)."""

    def _extra_info(self) -> dict:
        return {}

    def _extra_stats(self) -> dict:
        return {}

    def _extra_idle(self) -> dict:
        return {}

    def _queued_outside_engine(self) -> int:
        return 0

    def _waiting_outside_engine(self) -> int:
        return 0

    def _inflight(self) -> int:
        return 0

    def _close(self) -> None:
        pass
