"""NodeBase: what every node actor (prefill, decode, mixed) is made of.

An LLMEngine owned by an EngineLoop thread, a StreamHub for token streams, a buffer of the engine's
KV events, and the Ray-callable methods every role shares: ready(), load_report(), stats(),
drain_kv_events(), check_idle(), shutdown(). The role classes add their request path and queues.
Node classes are plain Python; the launcher wraps them with ray.remote and resource options.
"""
from __future__ import annotations

import logging
import time
from collections import deque

from engine.engine import LLMEngine
from engine.outputs import StepOutput
from node.engine_loop import EngineLoop
from node.host import host_info
from node.messages import KVEventBatch, LoadReport, TokenChunk
from node.streams import StreamHub

log = logging.getLogger(__name__)


class NodeBase:
    role = "node"

    def __init__(self, name: str, model: str | None = None, engine_options: dict | None = None,
                 num_cpus: float = 1.0):
        options = dict(engine_options or {})
        # Pin torch to the cores Ray gave this actor: more threads than cores only thrash.
        options.setdefault("num_threads", max(1, int(num_cpus)))
        self.name = name
        self._kv_events: deque = deque()
        self.engine = LLMEngine(model, on_kv_event=self._kv_events.append, **options)
        self.streams = StreamHub()
        self.loop = EngineLoop(self.engine, self._tick, self._on_outputs, self._on_crash, name)
        self.host = host_info()
        self.started_at = time.time()

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

    async def shutdown(self) -> None:
        self.loop.stop()
        self._close()

    # -- engine thread ------------------------------------------------------------------------------
    def _load_report(self) -> LoadReport:
        eng = self.engine
        sched = eng.scheduler
        queued = sum(r.num_prompt_tokens - min(r.num_computed_tokens, r.num_prompt_tokens)
                     for r in list(sched.waiting) + sched.running) + self._queued_outside_engine()
        return LoadReport(
            node_name=self.name, role=self.role, queued_prefill_tokens=queued,
            waiting=len(sched.waiting) + self._waiting_outside_engine(), running=len(sched.running),
            free_blocks=eng.allocator.num_free + eng.prefix_cache.num_evictable_blocks,
            total_blocks=eng.num_blocks, cached_blocks=len(eng.prefix_cache.cached_blocks()),
            inflight=self._inflight(), step_time_s=self.loop.step_time_s,
            prefill_tokens_per_s=self.loop.tokens_per_s, timestamp=time.time())

    def _stats(self) -> dict:
        return {"name": self.name, "role": self.role, **self.engine.stats(), **self._extra_stats()}

    def _drain_kv_events(self) -> KVEventBatch:
        events = tuple(self._kv_events)
        self._kv_events.clear()
        return KVEventBatch(self.name, events)

    def _kv_snapshot(self) -> tuple[int, list]:
        self._kv_events.clear()
        return self.engine.prefix_cache.snapshot()

    def _check_idle(self) -> dict:
        self.engine.check_block_integrity()
        return {"requests": len(self.engine.requests), "reservations": len(self.engine.reservations),
                "streams": len(self.streams.open_ids()), **self._extra_idle()}

    def _on_crash(self, e: BaseException) -> None:
        for rid in self.streams.open_ids():
            self.streams.push(TokenChunk(rid, (), finished=True, error=f"node {self.name} crashed: {e!r}"))

    # -- what roles override --------------------------------------------------------------------------
    def _tick(self) -> bool:
        """Advance the role's own queues; True while transfers are in flight (poll soon)."""
        return False

    def _on_outputs(self, outputs: list[StepOutput]) -> None:
        raise NotImplementedError

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
