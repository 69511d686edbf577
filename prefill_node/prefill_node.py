"""PrefillNode: an engine in prefill mode plus a KVSender. One room per request, keyed by the room id
the caller minted (the decode node knows the same id).

    prefill(req) ─> BOOTSTRAP ─destination arrived, aux slot free─> QUEUED (engine: waiting, chunked prefill)
                      │                                                │ first token sampled
                      │                                                v
                      │                                 INFLIGHT (KV + first token being written; blocks held)
                      │                                                │ receiver acknowledged (SUCCESS)
                      │                                                v
                      │                                 DONE: blocks back to the radix cache, PrefillResult(ok)
                      └─ bootstrap timeout, decode abort, decode dead, transfer failure/timeout (room FAILED)
                         ─> DONE: blocks freed (prompt blocks stay cached), PrefillResult(error)
    abort(request_id) in any state ─> ABORTING (sender aborts the room) ─room FAILED─> DONE(error "aborted")

Blocks of an INFLIGHT or ABORTING room are never freed before the sender says no byte can still move
(room terminal): the NIXL engine may be reading them.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from enum import Enum

from raypd.engine.errors import InvalidRequestError
from raypd.engine.outputs import StepOutput
from raypd.engine.request import RequestStatus
from raypd.kvtransfer import KVReceiver, KVSender, TransferState
from raypd.node.aux_slots import AuxRecord, AuxSlots
from raypd.protocol.messages import NodeRequest, PrefillResult
from raypd.node.node_base import NodeBase
from raypd.node.streams import Reply
from raypd.prefill_node.prefix_copy import PrefixCopies

log = logging.getLogger(__name__)
S = TransferState


class PrefillPhase(Enum):
    BOOTSTRAP = "bootstrap"
    QUEUED = "queued"
    INFLIGHT = "inflight"
    ABORTING = "aborting"


@dataclass(slots=True)
class PrefillRoom:
    req: NodeRequest
    reply: Reply
    phase: PrefillPhase = PrefillPhase.BOOTSTRAP
    aux_slot: int | None = None
    in_engine: bool = False
    num_cached_tokens: int = 0
    abort_reason: str | None = None
    t: dict = field(default_factory=dict)  # phase start times (time.time())


class PrefillNode(NodeBase):
    role = "prefill"

    def __init__(self, name: str, model: str | None = None, engine_options: dict | None = None,
                 num_cpus: float = 1.0, transfer_options: dict | None = None, aux_slots: int = 256):
        super().__init__(name, model, engine_options, num_cpus)
        self.transfer_config = self._transfer_config(transfer_options)
        self.aux = AuxSlots(aux_slots, self.engine.device)
        self.sender = KVSender(self.engine.kv_cache.pool, self.aux.buffer, self.transfer_config, name=name)
        # Receives prefixes other prefill nodes copy here (migration); the same pool, its own endpoint.
        self.receiver = KVReceiver(self.engine.kv_cache.pool, self.aux.buffer, self.transfer_config,
                                   name=f"{name}-import")
        self.copies = PrefixCopies(self.engine, self.sender, self.receiver)
        self.rooms: dict[str, PrefillRoom] = {}
        self.num_completed = 0
        self.num_failed = 0
        self.loop.start()

    # -- Ray-callable ---------------------------------------------------------------------------------
    async def prefill(self, req: NodeRequest) -> PrefillResult:
        """Serve the request's prefill and KV transfer; returns when its room has ended, either way."""
        reply = Reply()
        self.loop.call(self._add, req, reply)
        return await reply.wait()

    async def abort(self, request_id: str, reason: str = "aborted by the client") -> None:
        await self.loop.acall(self._abort, request_id, reason)

    # -- Ray-callable: prefix copies for the Conductor (prefix_copy.py) -------------------------------
    async def export_prefix(self, token_ids: list[int], room: int, target_node: str = "") -> PrefillResult:
        """Write the cached blocks of token_ids to the node importing room `room`."""
        reply = Reply()
        self.loop.call(self.copies.export, list(token_ids), room, reply)
        return await reply.wait()

    async def import_prefix(self, token_ids: list[int], room: int, source_bootstrap_address: str) -> PrefillResult:
        """Receive the blocks of token_ids from the node exporting room `room` into this prefix cache."""
        reply = Reply()
        self.loop.call(self.copies.import_, list(token_ids), room, source_bootstrap_address, reply)
        return await reply.wait()

    async def abort_migration(self, room: int) -> None:
        await self.loop.acall(self.copies.abort, room)

    # -- engine thread: admission and aborts ------------------------------------------------------------
    def _add(self, req: NodeRequest, reply: Reply) -> None:
        if req.request_id in self.rooms:
            reply.set(PrefillResult(req.request_id, False, f"request id {req.request_id!r} is already on this node"))
            return
        try:
            self.engine.validate(req.prompt_token_ids, req.params, prefill_only=True)
            self.sender.add_room(req.room)
        except Exception as e:  # bad prompt, duplicate room: the decode side learns by bootstrap timeout or Abort
            reply.set(PrefillResult(req.request_id, False, str(e)))
            return
        self.rooms[req.request_id] = PrefillRoom(req, reply, t={"arrived": time.time()})

    def _abort(self, request_id: str, reason: str) -> None:
        room = self.rooms.get(request_id)
        if room is None or room.phase == PrefillPhase.ABORTING:
            return
        if room.in_engine and room.phase == PrefillPhase.QUEUED:
            self.engine.abort(request_id)  # no byte is moving yet: free at once
            room.in_engine = False
        room.abort_reason = reason
        room.phase = PrefillPhase.ABORTING
        self.sender.abort(room.req.room, reason)

    # -- engine thread: the queues ----------------------------------------------------------------------
    def _tick(self) -> bool:
        for rid, room in list(self.rooms.items()):
            state = self.sender.poll(room.req.room)
            if room.phase == PrefillPhase.BOOTSTRAP:
                if state == S.FAILED:
                    self._finish(rid, self.sender.failure_reason(room.req.room) or "bootstrap failed")
                elif state >= S.WAITING_FOR_INPUT:
                    self._start_prefill(rid, room)
            elif room.phase == PrefillPhase.QUEUED:
                if state == S.FAILED:  # the decode side gave up while we computed
                    self.engine.abort(rid)
                    room.in_engine = False
                    self._finish(rid, self.sender.failure_reason(room.req.room) or "room failed")
            elif state.is_terminal:  # INFLIGHT or ABORTING: now no byte can still move
                if room.phase == PrefillPhase.ABORTING:
                    self._finish(rid, room.abort_reason or "aborted")
                elif state == S.SUCCESS:
                    room.t["transferred"] = time.time()
                    self._finish(rid, None)
                else:
                    self._finish(rid, self.sender.failure_reason(room.req.room) or "transfer failed")
        copying = self.copies.tick()
        return bool(self.rooms) or copying

    def _start_prefill(self, rid: str, room: PrefillRoom) -> None:
        slot = self.aux.take()
        if slot is None:
            return  # every aux slot is in flight: stay in BOOTSTRAP (the room's timeout still runs)
        room.aux_slot = slot
        try:
            self.engine.add_request(room.req.prompt_token_ids, room.req.params, request_id=rid, prefill_only=True)
        except InvalidRequestError as e:
            self._abort(rid, str(e))
            return
        room.in_engine = True
        room.phase = PrefillPhase.QUEUED
        room.t["bootstrapped"] = time.time()

    def _on_outputs(self, outputs: list[StepOutput]) -> None:
        now = time.time()
        for out in outputs:
            room = self.rooms.get(out.request_id)
            if room is None or room.phase != PrefillPhase.QUEUED:
                continue
            req = self.engine.requests[out.request_id]
            room.t["scheduled"] = req.first_scheduled_at or now
            room.t["prefilled"] = now
            room.num_cached_tokens = out.num_cached_tokens
            self.aux.write(room.aux_slot, AuxRecord(out.new_token_ids[0], out.num_cached_tokens,
                                                    req.num_prompt_tokens))
            room.phase = PrefillPhase.INFLIGHT
            try:
                self.sender.send(room.req.room, self.engine.prefilled_blocks(out.request_id), room.aux_slot)
            except Exception as e:  # noqa: BLE001 - a bad destination fails this request only
                log.warning("send for %s failed: %s", out.request_id, e)
                room.phase = PrefillPhase.QUEUED  # blocks never left: _abort may free them at once
                self._abort(out.request_id, f"KV send failed: {e}")

    def _finish(self, rid: str, error: str | None) -> None:
        room = self.rooms.pop(rid)
        if room.in_engine:
            if self.engine.requests[rid].status == RequestStatus.PREFILLED:
                self.engine.release(rid)  # prompt blocks stay in the radix cache for later requests
            else:
                self.engine.abort(rid)
        if room.aux_slot is not None:
            self.aux.give_back(room.aux_slot)
        record = self.sender.release(room.req.room)
        t = room.t
        t["ended"] = time.time()
        timings = _durations(t)
        # transfer_s ends at the engine thread's next look, after whatever step it was running; the
        # sender loop's own clock splits the handoff itself: bytes moving, then the receiver's Done.
        if error is None and None not in (record.t_posted, record.t_landed, record.t_done):
            timings["kv_write_s"] = record.t_landed - record.t_posted
            timings["kv_ack_s"] = record.t_done - record.t_landed
        if error is None:
            self.num_completed += 1
        else:
            self.num_failed += 1
        room.reply.set(PrefillResult(rid, error is None, error, room.num_cached_tokens, timings))

    # -- load and introspection ---------------------------------------------------------------------------
    def _queued_outside_engine(self) -> int:
        return sum(len(r.req.prompt_token_ids) for r in self.rooms.values() if r.phase == PrefillPhase.BOOTSTRAP)

    def _waiting_outside_engine(self) -> int:
        return sum(1 for r in self.rooms.values() if r.phase == PrefillPhase.BOOTSTRAP)

    def _inflight(self) -> int:
        return sum(1 for r in self.rooms.values() if r.phase == PrefillPhase.INFLIGHT)

    def _extra_info(self) -> dict:
        return {"bootstrap_address": self.sender.bootstrap_address}

    def _extra_stats(self) -> dict:
        phases = {p.value: 0 for p in PrefillPhase}
        for r in self.rooms.values():
            phases[r.phase.value] += 1
        c = self.copies
        return {"queues": phases, "completed": self.num_completed, "failed": self.num_failed,
                "transfer": asdict(self.sender.stats()),
                "prefix_copies": {"exported": c.num_exported, "imported": c.num_imported, "failed": c.num_failed}}

    def _extra_idle(self) -> dict:
        return {"rooms": len(self.rooms), "endpoint_rooms": self.sender.stats().rooms + self.receiver.stats().rooms,
                "copies": len(self.copies.exports) + len(self.copies.imports),
                "aux_in_use": len(self.aux.buffer) - self.aux.num_free}

    def _close(self) -> None:
        self.sender.close()
        self.receiver.close()


def _durations(t: dict) -> dict:
    """Seconds spent in each phase, from the phase start times that exist."""
    out = {}
    for name, a, b in (("bootstrap_s", "arrived", "bootstrapped"), ("queue_s", "bootstrapped", "scheduled"),
                       ("prefill_s", "scheduled", "prefilled"), ("transfer_s", "prefilled", "transferred")):
        if a in t and b in t:
            out[name] = max(0.0, t[b] - t[a])
    out["total_s"] = t["ended"] - t["arrived"]
    return out
