"""BootstrapStage: prefill requests whose room waits for the decode node's destination.

    add(pr): room opened in the KVSender ─> BOOTSTRAP (the decode node registers and sends the
             destination blocks it reserved)
        ├─ destination arrived, an aux slot free ─> pop_ready() ─> WaitingStage (the engine)
        └─ room FAILED: bootstrap timeout, decode node's abort, abort() confirmed
              ─> pop_ended(): room released, pr.error says why

Nothing but the room is held here: the engine sees a request only once its decode node has reserved
blocks for the KV, so a request no decode node takes costs no compute. While every aux slot is in
flight, requests with a destination wait here in arrival order (their rooms' timeout still runs).
"""
from __future__ import annotations

from raypd.kvtransfer import KVSender, TransferState
from raypd.node.aux_slots import AuxSlots
from raypd.prefill_node.prefill_request import PrefillPhase, PrefillRequest

S = TransferState


class BootstrapStage:
    def __init__(self, sender: KVSender, aux: AuxSlots):
        self._sender = sender
        self._aux = aux
        self._requests: dict[str, PrefillRequest] = {}  # arrival order

    def __len__(self) -> int:
        return len(self._requests)

    @property
    def num_aborting(self) -> int:
        return sum(pr.aborting for pr in self._requests.values())

    @property
    def num_prompt_tokens(self) -> int:
        """Prompt tokens waiting here (aborting requests left out): queued work the engine cannot see."""
        return sum(len(pr.req.prompt_token_ids) for pr in self._requests.values() if not pr.aborting)

    def add(self, pr: PrefillRequest) -> None:
        """Open the request's room; raises RoomError (nothing held) if the room id is in use here."""
        self._sender.add_room(pr.room)
        pr.phase = PrefillPhase.BOOTSTRAP
        self._requests[pr.request_id] = pr

    def pop_ready(self) -> list[PrefillRequest]:
        """Requests whose destination arrived, each now holding an aux slot, in arrival order."""
        ready = []
        for pr in self._requests.values():
            if pr.aborting or self._sender.poll(pr.room) < S.WAITING_FOR_INPUT:
                continue
            slot = self._aux.take()
            if slot is None:
                break
            pr.aux_slot = slot
            ready.append(pr)
        for pr in ready:
            del self._requests[pr.request_id]
        return ready

    def pop_ended(self) -> list[PrefillRequest]:
        """Requests whose room failed, their rooms released (they hold nothing more)."""
        ended = [pr for pr in self._requests.values() if self._sender.poll(pr.room) == S.FAILED]
        for pr in ended:
            del self._requests[pr.request_id]
            pr.error = pr.abort_reason or self._sender.failure_reason(pr.room) or "bootstrap failed"
            pr.record = self._sender.release(pr.room)
        return ended

    def abort(self, pr: PrefillRequest, reason: str) -> None:
        """Fail the room (the decode node hears); the request ends once the sender confirms."""
        pr.abort_reason = reason
        self._sender.abort(pr.room, reason)
