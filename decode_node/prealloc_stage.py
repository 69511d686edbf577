"""PreallocStage: decode requests waiting for KV blocks to receive their prompt into, in the order the
engine's waiting queue would start them (priority, then tenant share, then arrival).

    add(dr) ─> PREALLOC queue
        ├─ at the head: engine.reserve(prompt blocks) succeeds with the running requests' decode
        │  headroom kept, and an aux slot is free ─> pop_ready() ─> TransferStage
        ├─ waited past timeout_s ─> pop_ended() (holds nothing)
        └─ abort(), or remove() (the node displaced it for a newcomer) ─> leaves at once (holds nothing)

Back-pressure: while the head cannot reserve, nobody behind it does, so a long prompt is not starved
by short ones of its rank, and the running requests keep room to grow. The order is the engine's
(Scheduler.waiting_key), so the node's displacement at its bound (decode_duty.py) and the order
served here agree: a request that took a flooding tenant's place is not then served after the flood.
With one priority and one tenant it is first come, first served. `num_blocked` counts the requests
the last pop_ready() left waiting, which the node bounds (a burst that arrives between two ticks and
gets memory at once never waits).
"""
from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

from raypd.decode_node.decode_request import DecodePhase, DecodeRequest
from raypd.node.aux_slots import AuxSlots
from raypd.protocol.sampling_params import SamplingParams

if TYPE_CHECKING:  # torch: only a type here; a process that holds a node's handle imports this module
    from raypd.engine.engine import LLMEngine


class PreallocStage:
    def __init__(self, engine: LLMEngine, aux: AuxSlots, timeout_s: float):
        self._engine = engine
        self._aux = aux
        self.timeout_s = timeout_s
        self._queue: deque[DecodeRequest] = deque()
        self._left = 0  # requests the last pop_ready() could not serve

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def num_blocked(self) -> int:
        """Requests waiting since the last pop_ready() found no memory for them (some may have left since)."""
        return min(self._left, len(self._queue))

    def queued(self) -> list[tuple[str, SamplingParams]]:
        """(request id, params) of each request here, in the order served (as of the last pop_ready())."""
        return [(dr.request_id, dr.req.params) for dr in self._queue]

    def add(self, dr: DecodeRequest) -> None:
        dr.phase = DecodePhase.PREALLOC
        dr.deadline = time.monotonic() + self.timeout_s
        self._queue.append(dr)

    def pop_ready(self) -> list[DecodeRequest]:
        """Requests from the head for which blocks (key: the request id) and an aux slot were taken."""
        ready = []
        if len({(dr.req.params.priority, dr.req.params.tenant) for dr in self._queue}) > 1:
            key = self._engine.waiting_key(dr.req.params for dr in self._queue)
            self._queue = deque(sorted(self._queue, key=lambda dr: key(dr.req.params)))  # stable: arrival among equals
        while self._queue and self._aux.num_free:
            dr = self._queue[0]
            blocks = self._engine.reserve(dr.request_id, len(dr.req.prompt_token_ids))
            if blocks is None:
                break
            self._queue.popleft()
            dr.blocks = blocks
            dr.aux_slot = self._aux.take()
            dr.t["reserved"] = time.time()
            ready.append(dr)
        self._left = len(self._queue)
        return ready

    def pop_ended(self) -> list[DecodeRequest]:
        """Requests that waited past timeout_s (any place in the queue: it is not served in arrival order)."""
        now = time.monotonic()
        ended = [dr for dr in self._queue if dr.deadline < now]
        for dr in ended:
            self._queue.remove(dr)
        return ended

    def remove(self, dr: DecodeRequest) -> None:
        """Leave the queue at once: nothing is held yet."""
        self._queue.remove(dr)

    def abort(self, dr: DecodeRequest) -> None:
        self.remove(dr)
        dr.aborting = True
