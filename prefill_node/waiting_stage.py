"""WaitingStage: prefill requests in the engine, from admission to their first sampled token.

    add(pr): engine.add_request(prefill_only) ─> WAITING: the engine's waiting queue, then its running
             batch (prefix reuse, chunked prefill, token budget)
        ├─ first token sampled: the engine holds the request PREFILLED with its blocks
        │     ─> pop_ready(step outputs) ─> InflightStage
        └─ room FAILED (the decode node gave up or died while we computed) or abort()
              ─> engine request aborted at once (no byte is moving yet); pop_ended() once the room is
                 terminal: aux slot and room released, pr.error says why
                 (the node's displacement of a request that never started is such an abort, with
                 pr.overloaded set)

The rooms of waiting requests are polled only for failure: the engine's step outputs move them on.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from raypd.engine.errors import InvalidRequestError
from raypd.engine.outputs import StepOutput
from raypd.kvtransfer import KVSender, TransferState
from raypd.node.aux_slots import AuxSlots
from raypd.prefill_node.prefill_request import PrefillPhase, PrefillRequest

if TYPE_CHECKING:  # torch: only a type here; a process that holds a node's handle imports this module
    from raypd.engine.engine import LLMEngine

S = TransferState


class WaitingStage:
    def __init__(self, engine: LLMEngine, sender: KVSender, aux: AuxSlots):
        self._engine = engine
        self._sender = sender
        self._aux = aux
        self._requests: dict[str, PrefillRequest] = {}

    def __len__(self) -> int:
        return len(self._requests)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._requests

    @property
    def num_aborting(self) -> int:
        return sum(pr.aborting for pr in self._requests.values())

    def add(self, pr: PrefillRequest) -> None:
        """Queue the prompt in the engine; a request it refuses is aborted (its room fails)."""
        pr.phase = PrefillPhase.WAITING
        pr.t["bootstrapped"] = time.time()
        self._requests[pr.request_id] = pr
        try:
            self._engine.add_request(pr.req.prompt_token_ids, pr.req.params, request_id=pr.request_id,
                                     prefill_only=True)
        except InvalidRequestError as e:
            self.abort(pr, str(e))

    def pop_ready(self, outputs: list[StepOutput]) -> list[PrefillRequest]:
        """The requests this step prefilled, with their first token; the engine holds their blocks."""
        now = time.time()
        ready = []
        for out in outputs:
            pr = self._requests.get(out.request_id)
            if pr is None or pr.aborting:
                continue
            del self._requests[out.request_id]
            pr.first_token = out.new_token_ids[0]
            pr.num_cached_tokens = out.num_cached_tokens
            pr.t["scheduled"] = self._engine.requests[out.request_id].first_scheduled_at or now
            pr.t["prefilled"] = now
            ready.append(pr)
        return ready

    def pop_ended(self) -> list[PrefillRequest]:
        """Requests whose room failed, freed: engine request, aux slot, room."""
        ended = [pr for pr in self._requests.values() if self._sender.poll(pr.room) == S.FAILED]
        for pr in ended:
            del self._requests[pr.request_id]
            self._engine.abort(pr.request_id)  # a no-op when abort() already did it
            if pr.aux_slot is not None:
                self._aux.give_back(pr.aux_slot)
                pr.aux_slot = None
            pr.error = pr.abort_reason or self._sender.failure_reason(pr.room) or "room failed"
            pr.record = self._sender.release(pr.room)
        return ended

    def abort(self, pr: PrefillRequest, reason: str) -> None:
        """Free the engine request now (no byte of it is moving); the request ends with its room."""
        self._engine.abort(pr.request_id)
        pr.abort_reason = reason
        self._sender.abort(pr.room, reason)
