"""MixedNode: one engine that prefills and decodes, streaming tokens: the colocated baseline.

    generate() --add--> engine waiting --admitted--> running --stop / length--> final chunk
        │   any state --client abort / node crash--> final chunk ("abort" or error)
        └─ max_waiting_requests already waiting --> final chunk (overloaded) at once, nothing held

It has no stages of its own: the engine's queues are the whole lifecycle. Tokens go to
req.reply_address over pyzmq (node/streams.py); generate() returns the StreamEnd.
"""
from __future__ import annotations

import time

from raypd.engine.errors import InvalidRequestError
from raypd.engine.outputs import StepOutput
from raypd.kvtransfer.data_plane_auth import DataPlaneSecret
from raypd.node.node_core import NodeCore
from raypd.protocol.messages import OVERLOADED, KVEventBatch, LoadReport, NodeRequest, StreamEnd, TokenChunk
from raypd.protocol.roles import Role


class MixedNode:
    role = Role.MIXED

    def __init__(self, name: str, model: str | None = None, engine_options: dict | None = None,
                 num_cpus: float = 1.0, data_plane_secret: DataPlaneSecret | None = None):
        self.name = name
        self.core = NodeCore(name, self.role, model, engine_options, num_cpus, on_outputs=self._on_outputs,
                             data_plane_secret=data_plane_secret)
        self.host = self.core.host
        self._arrived: dict[str, float] = {}        # request id -> time.time() it was added
        self._first_token: dict[str, float] = {}
        # Back-pressure: while the engine's last step left this many waiting (no running slot or no
        # memory for them), the next request is refused at once (HTTP 429 at the ingress).
        self.max_waiting = self.core.engine.config.waiting_limit
        self.num_refused = 0
        self.core.start()

    # -- Ray-callable -------------------------------------------------------------------------------
    async def generate(self, req: NodeRequest) -> StreamEnd:
        """Stream the request's tokens to req.reply_address; return once it ended (the final chunk
        and how many tokens the stream carried)."""
        return await self.core.stream(req, self._add, self._abort)

    async def abort(self, request_id: str) -> None:
        await self.core.call(self._abort, request_id)

    # -- Ray-callable, every role ---------------------------------------------------------------------
    async def ready(self) -> dict:
        return self.core.info()

    async def load_report(self) -> LoadReport:
        return await self.core.call(self._load_report)

    async def stats(self) -> dict:
        return await self.core.call(self._stats)

    async def drain_kv_events(self) -> KVEventBatch:
        return await self.core.call(self.core.drain_kv_events)

    async def kv_snapshot(self) -> tuple[int, list]:
        return await self.core.call(self.core.kv_snapshot)

    async def check_idle(self) -> dict:
        return await self.core.call(self.core.check_idle)

    async def attach_conductor(self, conductor) -> None:
        await self.core.attach_conductor(conductor, self)

    async def crash_engine(self) -> None:
        """Chaos testing: crash this node's engine thread (node/node_core.py says what follows)."""
        self.core.crash_engine()

    async def fail_requests(self, n: int) -> int:
        """Chaos testing: fail the next n requests at once, while the node stays up (NodeCore.fail_requests)."""
        return await self.core.fail_requests(n)

    async def shutdown(self) -> None:
        self.core.shutdown()

    # -- engine thread ------------------------------------------------------------------------------
    def _add(self, req: NodeRequest) -> None:
        waiting = self.core.engine.num_backlogged()
        if waiting >= self.max_waiting:
            self.num_refused += 1
            self.core.streams.push(TokenChunk(
                req.request_id, (), True, OVERLOADED,
                f"mixed node {self.name} is full: {waiting} requests already wait to run (max_waiting_requests)"))
            return
        try:
            self.core.engine.add_request(req.prompt_token_ids, req.params, request_id=req.request_id)
        except InvalidRequestError as e:
            self.core.streams.push(TokenChunk(req.request_id, (), finished=True, error=str(e)))
            return
        self._arrived[req.request_id] = time.time()

    def _abort(self, request_id: str) -> None:
        if request_id in self.core.engine.requests:
            self.core.engine.abort(request_id)
            self._arrived.pop(request_id, None)
            self._first_token.pop(request_id, None)
            self.core.streams.push(TokenChunk(request_id, (), finished=True, finish_reason="abort"))

    def _on_outputs(self, outputs: list[StepOutput]) -> None:
        now = time.time()
        for out in outputs:
            rid = out.request_id
            if rid not in self._arrived:
                continue
            first = self._first_token.setdefault(rid, now)
            timings = {}
            if out.finished:
                arrived = self._arrived.pop(rid)
                del self._first_token[rid]
                timings = {"ttft_s": first - arrived, "total_s": now - arrived}
            self.core.streams.push(TokenChunk(rid, tuple(out.new_token_ids), out.finished, out.finish_reason,
                                              num_cached_tokens=out.num_cached_tokens, timings=timings))

    def _load_report(self) -> LoadReport:
        return self.core.load_report(stats=self._stats())

    def _stats(self) -> dict:
        return self.core.stats(refused=self.num_refused)
