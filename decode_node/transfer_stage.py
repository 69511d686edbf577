"""TransferStage: decode requests whose prompt KV and first token are coming from the prefill node.

    add(dr): receiver.add_room(room, the prefill node's bootstrap address, reserved blocks, aux slot)
             ─> TRANSFER: room BOOTSTRAPPING ─registered, destination sent─> WAITING_FOR_INPUT
                ─Sending─> TRANSFERRING
        ├─ room SUCCESS: KV and aux record landed ─> pop_ready(): record read, room and aux slot
        │     released; the reservation goes on to RunningStage
        └─ room FAILED: bootstrap / wait / transfer timeout, the prefill node's abort or death
           ─> pop_ended(): reservation, aux slot and room freed, dr.error says why
    abort(): the receiver aborts the room; the request ends (finish_reason "abort") once the room
             is terminal, whichever way it went

Reserved blocks are freed only once the room is terminal: until then the prefill node may be
writing into them.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from raypd.decode_node.decode_request import DecodePhase, DecodeRequest
from raypd.kvtransfer import KVReceiver, TransferState
from raypd.node.aux_slots import AuxSlots

if TYPE_CHECKING:  # torch: only a type here; a process that holds a node's handle imports this module
    from raypd.engine.engine import LLMEngine

S = TransferState


class TransferStage:
    def __init__(self, engine: LLMEngine, receiver: KVReceiver, aux: AuxSlots):
        self._engine = engine
        self._receiver = receiver
        self._aux = aux
        self._requests: dict[str, DecodeRequest] = {}

    def __len__(self) -> int:
        return len(self._requests)

    @property
    def num_aborting(self) -> int:
        return sum(dr.aborting for dr in self._requests.values())

    def add(self, dr: DecodeRequest) -> None:
        """Open the room for a request holding a reservation and an aux slot. If the receiver refuses
        (bad address, room id in use) this raises, with the reservation and the aux slot freed."""
        try:
            self._receiver.add_room(dr.room, dr.req.bootstrap_address, dr.blocks, dr.aux_slot)
        except Exception:
            self._unreserve(dr)
            raise
        dr.phase = DecodePhase.TRANSFER
        self._requests[dr.request_id] = dr

    def pop_ready(self) -> list[DecodeRequest]:
        """Requests whose KV landed, with dr.record read from the aux slot (None if none was valid);
        they still hold their reservation."""
        ready = [dr for dr in self._requests.values()
                 if not dr.aborting and self._receiver.poll(dr.room) == S.SUCCESS]
        now = time.time()
        for dr in ready:
            del self._requests[dr.request_id]
            assert dr.aux_slot is not None
            dr.record = self._aux.read(dr.aux_slot)
            self._aux.give_back(dr.aux_slot)
            dr.aux_slot = None
            self._receiver.release(dr.room)
            dr.t["kv_arrived"] = now
        return ready

    def pop_ended(self) -> list[DecodeRequest]:
        """Requests whose room failed, or that were aborted and whose room is now terminal, freed."""
        ended = []
        for dr in self._requests.values():
            state = self._receiver.poll(dr.room)
            if state == S.FAILED or (dr.aborting and state.is_terminal):
                if not dr.aborting:
                    dr.error = f"KV transfer failed: {self._receiver.failure_reason(dr.room) or 'no reason given'}"
                ended.append(dr)
        for dr in ended:
            del self._requests[dr.request_id]
            self._receiver.release(dr.room)
            self._unreserve(dr)
        return ended

    def abort(self, dr: DecodeRequest) -> None:
        """Ask the prefill node to stop; the blocks stay reserved until the room is terminal."""
        dr.aborting = True
        self._receiver.abort(dr.room, "aborted by the client")

    def _unreserve(self, dr: DecodeRequest) -> None:
        self._engine.unreserve(dr.request_id)
        dr.blocks = []
        if dr.aux_slot is not None:
            self._aux.give_back(dr.aux_slot)
            dr.aux_slot = None
