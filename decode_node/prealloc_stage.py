"""PreallocStage: decode requests waiting for KV blocks to receive their prompt into, first come first served.

    add(dr) ─> PREALLOC queue
        ├─ at the head: engine.reserve(prompt blocks) succeeds with the running requests' decode
        │  headroom kept, and an aux slot is free ─> pop_ready() ─> TransferStage
        ├─ waited past timeout_s ─> pop_ended() (holds nothing)
        └─ abort() ─> leaves at once (holds nothing)

Back-pressure: while the head cannot reserve, nobody behind it does, so a long prompt is not starved
by short ones, and the running requests keep room to grow. All wait the same timeout, so the head
is always the first to expire. `num_blocked` counts the requests the last pop_ready() left waiting,
which the node bounds (a burst that arrives between two ticks and gets memory at once never waits).
"""
from __future__ import annotations

import time
from collections import deque

from raypd.decode_node.decode_request import DecodePhase, DecodeRequest
from raypd.engine.engine import LLMEngine
from raypd.node.aux_slots import AuxSlots


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

    def add(self, dr: DecodeRequest) -> None:
        dr.phase = DecodePhase.PREALLOC
        dr.deadline = time.monotonic() + self.timeout_s
        self._queue.append(dr)

    def pop_ready(self) -> list[DecodeRequest]:
        """Requests from the head for which blocks (key: the request id) and an aux slot were taken."""
        ready = []
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
        """Requests that waited past timeout_s, oldest first."""
        now = time.monotonic()
        ended = []
        while self._queue and self._queue[0].deadline < now:
            ended.append(self._queue.popleft())
        return ended

    def abort(self, dr: DecodeRequest) -> None:
        """Leave the queue at once: nothing is held yet."""
        self._queue.remove(dr)
        dr.aborting = True
