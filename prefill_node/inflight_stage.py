"""InflightStage: prefilled requests whose KV and aux record are being written to the decode node.

    add(pr): aux record written (first token, cached tokens, prompt length), sender.send(prompt
             blocks, aux slot) ─> INFLIGHT: room TRANSFERRING (or armed until the destination is posted)
        ├─ the receiver's Done: room SUCCESS ─> pop_ready()
        └─ room FAILED: write failed, transfer timeout, decode node's abort or death, abort() confirmed
              ─> pop_ended(), pr.error says why
    Either way the request leaves freed: engine.release() (the prompt's blocks stay in the radix
    cache: their KV is valid whatever became of the copy), aux slot and room released.

Blocks stay held until the room is terminal, aborted or not: the transport may be reading them. The
one exception is a send() that raised: then no byte left, and the engine request is freed at once.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from raypd.kvtransfer import KVSender, TransferState
from raypd.node.aux_slots import AuxRecord, AuxSlots
from raypd.prefill_node.prefill_request import PrefillPhase, PrefillRequest

if TYPE_CHECKING:  # torch: only a type here; a process that holds a node's handle imports this module
    from raypd.engine.engine import LLMEngine

log = logging.getLogger(__name__)
S = TransferState


class InflightStage:
    def __init__(self, engine: LLMEngine, sender: KVSender, aux: AuxSlots):
        self._engine = engine
        self._sender = sender
        self._aux = aux
        self._requests: dict[str, PrefillRequest] = {}

    def __len__(self) -> int:
        return len(self._requests)

    @property
    def num_aborting(self) -> int:
        return sum(pr.aborting for pr in self._requests.values())

    def add(self, pr: PrefillRequest) -> None:
        """Write the aux record and post the KV write (a request holding an aux slot, PREFILLED)."""
        assert pr.aux_slot is not None, "a prefilled request holds an aux slot"
        pr.phase = PrefillPhase.INFLIGHT
        self._requests[pr.request_id] = pr
        blocks = self._engine.prefilled_blocks(pr.request_id)
        self._aux.write(pr.aux_slot, AuxRecord(pr.first_token, pr.num_cached_tokens, len(pr.req.prompt_token_ids), pr.room))
        try:
            self._sender.send(pr.room, blocks, pr.aux_slot)
        except Exception as e:  # noqa: BLE001 - a bad destination fails this request only
            log.warning("send for %s failed: %s", pr.request_id, e)
            self._engine.abort(pr.request_id)  # no byte left: the blocks go back at once
            self.abort(pr, f"KV send failed: {e}")

    def pop_ready(self) -> list[PrefillRequest]:
        """Requests whose KV the decode node acknowledged, freed (t["transferred"] stamped)."""
        done = [pr for pr in self._requests.values()
                if not pr.aborting and self._sender.poll(pr.room) == S.SUCCESS]
        now = time.time()
        for pr in done:
            pr.t["transferred"] = now
            self._free(pr)
        return done

    def pop_ended(self) -> list[PrefillRequest]:
        """Requests whose room failed, or that were aborted and whose room is now terminal, freed."""
        ended = []
        for pr in self._requests.values():
            state = self._sender.poll(pr.room)
            if state == S.FAILED or (pr.aborting and state.is_terminal):
                pr.error = pr.abort_reason or self._sender.failure_reason(pr.room) or "transfer failed"
                ended.append(pr)
        for pr in ended:
            self._free(pr)
        return ended

    def abort(self, pr: PrefillRequest, reason: str) -> None:
        """Ask the sender to stop; the blocks stay held until it says no byte can still move."""
        pr.abort_reason = reason
        self._sender.abort(pr.room, reason)

    def _free(self, pr: PrefillRequest) -> None:
        del self._requests[pr.request_id]
        if pr.request_id in self._engine.requests:
            self._engine.release(pr.request_id)
        assert pr.aux_slot is not None
        self._aux.give_back(pr.aux_slot)
        pr.aux_slot = None
        pr.record = self._sender.release(pr.room)
