"""MixedNode: one engine that prefills and decodes, streaming tokens: the colocated baseline.

    generate() --add--> engine waiting --admitted--> running --stop / length--> final chunk
        any state --client abort / node crash--> final chunk ("abort" or error)

Tokens go to req.reply_address over pyzmq (node/streams.py); generate() returns the StreamEnd.
"""
from __future__ import annotations

import time

from raypd.engine.errors import InvalidRequestError
from raypd.engine.outputs import StepOutput
from raypd.protocol.messages import NodeRequest, StreamEnd, TokenChunk
from raypd.node.node_base import NodeBase


class MixedNode(NodeBase):
    role = "mixed"

    def __init__(self, name: str, model: str | None = None, engine_options: dict | None = None,
                 num_cpus: float = 1.0):
        super().__init__(name, model, engine_options, num_cpus)
        self._timings: dict[str, dict] = {}
        self.loop.start()

    async def generate(self, req: NodeRequest) -> StreamEnd:
        """Stream the request's tokens to req.reply_address; return once it ended (the final chunk
        and how many tokens the stream carried)."""
        return await self._stream_request(req, self._add, self._abort)

    async def abort(self, request_id: str) -> None:
        await self.loop.acall(self._abort, request_id)

    # -- engine thread ------------------------------------------------------------------------------
    def _add(self, req: NodeRequest) -> None:
        try:
            self.engine.add_request(req.prompt_token_ids, req.params, request_id=req.request_id)
        except InvalidRequestError as e:
            self.streams.push(TokenChunk(req.request_id, (), finished=True, error=str(e)))
            return
        self._timings[req.request_id] = {"arrived": time.time()}

    def _abort(self, request_id: str) -> None:
        if request_id in self.engine.requests:
            self.engine.abort(request_id)
            self._timings.pop(request_id, None)
            self.streams.push(TokenChunk(request_id, (), finished=True, finish_reason="abort"))

    def _on_outputs(self, outputs: list[StepOutput]) -> None:
        now = time.time()
        for out in outputs:
            t = self._timings.get(out.request_id)
            if t is None:
                continue
            t.setdefault("first_token", now)
            timings = {}
            if out.finished:
                del self._timings[out.request_id]
                timings = {"ttft_s": t["first_token"] - t["arrived"], "total_s": now - t["arrived"]}
            self.streams.push(TokenChunk(out.request_id, tuple(out.new_token_ids), out.finished, out.finish_reason,
                                         num_cached_tokens=out.num_cached_tokens, timings=timings))
