"""BootstrapStage: prefill requests waiting to enter the engine, their rooms open in the KVSender.

    add(pr): room opened ─> BOOTSTRAP (the decode node registers and sends the destination blocks it
             reserved)
        ├─ destination arrived, or early admission (below), and an aux slot free
        │     ─> pop_ready(early) ─> WaitingStage (the engine)
        └─ room FAILED: bootstrap timeout, decode node's abort, abort() confirmed
              ─> pop_ended(): room released, pr.error says why

Early admission: up to `early` requests (the node's max_early_prefills less those already computing
without a destination) enter the engine before their destination arrives, so the prefill overlaps the
decode node's reservation, which waits for the end of a decode step (measured at ~0.85 of one, the
largest part of the split path's TTFT beside the prefill itself). Their KV write is armed and posted
by the sender the moment the destination comes (KVSender.send). vLLM and Mooncake prefill before the
decode side is known; SGLang waits for it, so a request no decode node takes costs no compute. The
limit keeps what such requests can cost bounded: beyond it, requests wait here for their destination.
Nothing but the room is held here. While every aux slot is in flight, requests wait in arrival order
(their rooms' timeout still runs).
"""
from __future__ import annotations

from raypd.kvtransfer import KVSender, TransferState
from raypd.node.aux_slots import AuxSlots
from raypd.prefill_node.prefill_request import PrefillPhase, PrefillRequest
from raypd.protocol.queued_by_priority import QueuedByPriority, summarize

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

    def prompt_tokens_by_priority(self) -> QueuedByPriority:
        """num_prompt_tokens by each request's priority: the engine's queue orders them so once they enter it."""
        return summarize((pr.req.params.priority, len(pr.req.prompt_token_ids))
                         for pr in self._requests.values() if not pr.aborting)

    def add(self, pr: PrefillRequest) -> None:
        """Open the request's room; raises RoomError (nothing held) if the room id is in use here."""
        self._sender.add_room(pr.room)
        pr.phase = PrefillPhase.BOOTSTRAP
        self._requests[pr.request_id] = pr

    def pop_ready(self, early: int = 0) -> list[PrefillRequest]:
        """Requests whose destination arrived, and up to `early` more without one, each now holding
        an aux slot, in arrival order."""
        ready = []
        for pr in self._requests.values():
            state = self._sender.poll(pr.room)
            if pr.aborting or state == S.FAILED:   # pop_ended() takes it
                continue
            if state == S.BOOTSTRAPPING:
                if early <= 0:
                    continue
                early -= 1
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
