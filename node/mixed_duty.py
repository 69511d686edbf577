"""MixedDuty: one engine that prefills and decodes, streaming tokens: the colocated baseline's duty
(a MixedNode's: mixed_node.py).

    generate() --add--> engine waiting --admitted--> running --stop / length--> final chunk
        │   any state --client abort / node crash--> final chunk ("abort" or error)
        │   waiting, never started --a newcomer took its place--> final chunk (overloaded), freed
        └─ max_waiting_requests already waiting:
             ├─ it ranks before the one that would start last (Scheduler.displaced_by: priority, then
             │  tenant share; one that never started) --> added; that one ends as above
             └─ otherwise --> final chunk (overloaded) at once, nothing held

It has no stages of its own: the engine's queues are the whole lifecycle. Tokens go to
req.reply_address over pyzmq (node/streams.py).
"""
from __future__ import annotations

import time
from typing import Any

from raypd.engine.errors import InvalidRequestError
from raypd.engine.outputs import StepOutput
from raypd.node.node_core import NodeCore
from raypd.node.node_duty import DutyLoad
from raypd.protocol.messages import OVERLOADED, NodeRequest, StreamEnd, TokenChunk


class MixedDuty:
    """The colocated duty on `core` (node/node_duty.py's NodeDuty)."""

    def __init__(self, core: NodeCore, name: str):
        self.core, self.name = core, name
        self._arrived: dict[str, float] = {}        # request id -> time.time() it was added
        self._first_token: dict[str, float] = {}
        # Back-pressure: while the engine's last step left this many waiting (no running slot or no
        # memory for them), the next request is refused at once (HTTP 429 at the ingress), unless it
        # ranks before a waiting one, which it then displaces (_add).
        self.max_waiting = core.engine.config.waiting_limit
        self.num_refused = 0     # refusals for capacity, displaced requests included (as at the ingress)
        self.num_displaced = 0

    async def generate(self, req: NodeRequest) -> StreamEnd:
        """Stream the request's tokens to req.reply_address; return once it ended (the final chunk
        and how many tokens the stream carried)."""
        return await self.core.stream(req, self._add, self.abort)

    def ready_info(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass  # no endpoints: the core's streams close with it

    # -- engine thread ------------------------------------------------------------------------------
    def _add(self, req: NodeRequest) -> None:
        waiting = self.core.engine.num_backlogged()
        displaced = None
        if waiting >= self.max_waiting:
            displaced = self.core.engine.displaced_by(req.params, self._arrived)
            if displaced is None:
                self.num_refused += 1
                self.core.streams.push(TokenChunk(
                    req.request_id, (), True, OVERLOADED,
                    f"mixed node {self.name} is full: {waiting} requests already wait to run (max_waiting_requests)"))
                return
        try:
            self.core.engine.add_request(req.prompt_token_ids, req.params, request_id=req.request_id)
        except InvalidRequestError as e:  # a bad newcomer displaces nobody
            self.core.streams.push(TokenChunk(req.request_id, (), finished=True, error=str(e)))
            return
        self._arrived[req.request_id] = time.time()
        if displaced is not None:
            self._displace(displaced, req.request_id)

    def _displace(self, request_id: str, by: str) -> None:
        """End a waiting request that never started (it holds nothing) as refused: `by` took its place."""
        self.num_refused += 1
        self.num_displaced += 1
        self.core.engine.abort(request_id)
        self._arrived.pop(request_id)
        self.core.streams.push(TokenChunk(
            request_id, (), True, OVERLOADED, f"mixed node {self.name} is full: request {by!r} ranks before this "
                                              f"one in its queue (priority, then tenant share) and took its place "
                                              f"(max_waiting_requests)"))

    def abort(self, request_id: str, reason: str = "aborted by the client") -> bool:
        if request_id not in self.core.engine.requests:
            return False
        self.core.engine.abort(request_id)
        self._arrived.pop(request_id, None)
        self._first_token.pop(request_id, None)
        self.core.streams.push(TokenChunk(request_id, (), finished=True, finish_reason="abort"))
        return True

    def tick(self) -> bool:
        return False  # nothing outside the engine to advance

    def on_outputs(self, outputs: list[StepOutput]) -> None:
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

    # -- load and introspection -----------------------------------------------------------------------
    def load(self) -> DutyLoad:
        return DutyLoad()  # the engine's queues are the whole lifecycle

    def role_stats(self) -> dict[str, Any]:
        return {"refused": self.num_refused, "displaced": self.num_displaced}

    def still_held(self) -> dict[str, int]:
        return {}
