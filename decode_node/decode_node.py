"""DecodeNode: an engine in decode mode plus a KVReceiver. One room per request, keyed by the room id
the caller minted (the prefill node knows the same id).

    generate(req) ─> PREALLOC ─blocks reserved with headroom kept, aux slot free─> TRANSFER
                        │ prealloc timeout (no memory)                 │ room SUCCESS: KV + first token landed
                        │                                              v
                        │                          RUNNING (engine batch; tokens streamed each step;
                        │                                   may be retracted and recomputed locally)
                        │                                              │ stop / length
                        v                                              v
                   final chunk (error)                          final chunk (finish_reason)
    TRANSFER ─room FAILED (bootstrap / wait / transfer timeout, prefill abort, prefill dead)─> error chunk
    abort in PREALLOC / RUNNING ─> final chunk "abort" at once;
    abort in TRANSFER ─> ABORTING (receiver aborts the room) ─room terminal─> final chunk "abort"

Reserved blocks are freed only when the room is terminal: until then the prefill node may be writing.
Every path ends with exactly one final chunk, so a caller is never left waiting in silence. Tokens go
to req.reply_address over pyzmq (node/streams.py); generate() returns the StreamEnd over Ray.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from enum import Enum

from raypd.engine.errors import InvalidRequestError
from raypd.engine.outputs import StepOutput
from raypd.kvtransfer import KVReceiver, TransferState
from raypd.node.aux_slots import AuxSlots
from raypd.protocol.messages import NodeRequest, StreamEnd, TokenChunk
from raypd.node.node_base import NodeBase

log = logging.getLogger(__name__)
S = TransferState


class DecodePhase(Enum):
    PREALLOC = "prealloc"
    TRANSFER = "transfer"
    RUNNING = "running"
    ABORTING = "aborting"


@dataclass(slots=True)
class DecodeRoom:
    req: NodeRequest
    phase: DecodePhase = DecodePhase.PREALLOC
    aux_slot: int | None = None
    reserved: bool = False
    deadline: float = 0.0  # PREALLOC: give up after this (time.monotonic())
    num_cached_tokens: int = 0
    t: dict = field(default_factory=dict)


class DecodeNode(NodeBase):
    role = "decode"

    def __init__(self, name: str, model: str | None = None, engine_options: dict | None = None,
                 num_cpus: float = 1.0, transfer_options: dict | None = None, aux_slots: int = 256,
                 prealloc_timeout_s: float | None = None):
        super().__init__(name, model, engine_options, num_cpus)
        self.transfer_config = self._transfer_config(transfer_options)
        # The prefill side waits bootstrap_timeout_s for our destination, so waiting longer for
        # memory here would only reserve blocks for a room the prefill node has already dropped.
        self.prealloc_timeout_s = min(prealloc_timeout_s or self.transfer_config.bootstrap_timeout_s,
                                      self.transfer_config.bootstrap_timeout_s)
        self.aux = AuxSlots(aux_slots, self.engine.device)
        self.receiver = KVReceiver(self.engine.kv_cache.pool, self.aux.buffer, self.transfer_config, name=name)
        self.rooms: dict[str, DecodeRoom] = {}
        self.prealloc: deque[str] = deque()
        self.loop.start()

    # -- Ray-callable ---------------------------------------------------------------------------------
    async def generate(self, req: NodeRequest) -> StreamEnd:
        """Decode a request whose prefill runs on the node at req.bootstrap_address, streaming its
        tokens to req.reply_address; return once it ended (the final chunk and how many tokens the
        stream carried)."""
        return await self._stream_request(req, self._add, self._abort)

    async def abort(self, request_id: str) -> None:
        await self.loop.acall(self._abort, request_id)

    # -- engine thread: admission and aborts ------------------------------------------------------------
    def _add(self, req: NodeRequest) -> None:
        rid = req.request_id
        try:
            if rid in self.rooms or rid in self.engine.requests:
                raise InvalidRequestError(f"request id {rid!r} is already on this node", "request_id")
            if not req.bootstrap_address:
                raise InvalidRequestError("a decode request needs the prefill node's bootstrap address",
                                          "bootstrap_address")
            self.engine.validate(req.prompt_token_ids, req.params)
        except InvalidRequestError as e:
            self.streams.push(TokenChunk(rid, (), finished=True, error=str(e)))
            return
        self.rooms[rid] = DecodeRoom(req, deadline=time.monotonic() + self.prealloc_timeout_s,
                                     t={"arrived": time.time()})
        self.prealloc.append(rid)

    def _abort(self, request_id: str) -> None:
        room = self.rooms.get(request_id)
        if room is None or room.phase == DecodePhase.ABORTING:
            return
        if room.phase == DecodePhase.TRANSFER:
            room.phase = DecodePhase.ABORTING  # wait for the room to be terminal before freeing blocks
            self.receiver.abort(room.req.room, "aborted by the client")
            return
        if room.phase == DecodePhase.PREALLOC:
            self.prealloc.remove(request_id)
        else:
            self.engine.abort(request_id)
        self._end(request_id, TokenChunk(request_id, (), finished=True, finish_reason="abort"))

    # -- engine thread: the queues ----------------------------------------------------------------------
    def _tick(self) -> bool:
        self._admit_prealloc()
        for rid, room in list(self.rooms.items()):
            if room.phase not in (DecodePhase.TRANSFER, DecodePhase.ABORTING):
                continue
            state = self.receiver.poll(room.req.room)
            if not state.is_terminal:
                continue
            if room.phase == DecodePhase.ABORTING:
                self._end(rid, TokenChunk(rid, (), finished=True, finish_reason="abort"))
            elif state == S.SUCCESS:
                self._start_decode(rid, room)
            else:
                reason = self.receiver.failure_reason(room.req.room) or "KV transfer failed"
                self._end(rid, TokenChunk(rid, (), finished=True, error=f"KV transfer failed: {reason}"))
        return any(r.phase in (DecodePhase.TRANSFER, DecodePhase.ABORTING) for r in self.rooms.values()) \
            or bool(self.prealloc)

    def _admit_prealloc(self) -> None:
        """FIFO: reserve blocks for the oldest waiting request while memory allows (back-pressure)."""
        now = time.monotonic()
        while self.prealloc:
            rid = self.prealloc[0]
            room = self.rooms[rid]
            if now > room.deadline:
                self.prealloc.popleft()
                self._end(rid, TokenChunk(rid, (), finished=True, error=(
                    f"no KV memory for the prompt on {self.name} within {self.prealloc_timeout_s:.0f}s")))
                continue
            if self.aux.num_free == 0:
                return
            blocks = self.engine.reserve(room.req.room, len(room.req.prompt_token_ids))
            if blocks is None:
                return
            room.reserved = True
            room.aux_slot = self.aux.take()
            self.prealloc.popleft()
            try:
                self.receiver.add_room(room.req.room, room.req.bootstrap_address, blocks, room.aux_slot)
            except Exception as e:  # noqa: BLE001 - bad address or room id: this request fails alone
                self._end(rid, TokenChunk(rid, (), finished=True, error=f"cannot open KV room: {e}"))
                continue
            room.phase = DecodePhase.TRANSFER
            room.t["reserved"] = time.time()

    def _start_decode(self, rid: str, room: DecodeRoom) -> None:
        rec = self.aux.read(room.aux_slot)
        self.receiver.release(room.req.room)
        n = len(room.req.prompt_token_ids)
        if rec is None or rec.num_prompt_tokens != n:
            self._end(rid, TokenChunk(rid, (), finished=True, error=f"KV arrived without a valid aux record: {rec}"),
                      room_released=True)
            return
        room.t["kv_arrived"] = time.time()
        self.aux.give_back(room.aux_slot)
        room.aux_slot = None
        try:
            out = self.engine.add_prefilled(room.req.room, room.req.prompt_token_ids, rec.first_token,
                                            room.req.params, rid, rec.num_cached_tokens)
        except InvalidRequestError as e:
            self._end(rid, TokenChunk(rid, (), finished=True, error=str(e)), room_released=True)
            return
        room.reserved = False  # the blocks now belong to the engine's request
        room.phase = DecodePhase.RUNNING
        room.num_cached_tokens = rec.num_cached_tokens
        self._emit(rid, room, out)

    def _on_outputs(self, outputs: list[StepOutput]) -> None:
        for out in outputs:
            room = self.rooms.get(out.request_id)
            if room is not None and room.phase == DecodePhase.RUNNING:
                self._emit(out.request_id, room, out)

    def _emit(self, rid: str, room: DecodeRoom, out: StepOutput) -> None:
        now = time.time()
        if "first_token" in room.t:
            room.t.setdefault("first_step", now)
        room.t.setdefault("first_token", now)
        chunk = TokenChunk(rid, tuple(out.new_token_ids), out.finished, out.finish_reason,
                           num_cached_tokens=room.num_cached_tokens)
        if out.finished:
            self._end(rid, chunk)
        else:
            self.streams.push(chunk)

    def _end(self, rid: str, chunk: TokenChunk, room_released: bool = False) -> None:
        """Free everything the room holds and send its final chunk."""
        room = self.rooms.pop(rid)
        if room.reserved:
            self.engine.unreserve(room.req.room)
        if room.aux_slot is not None:
            self.aux.give_back(room.aux_slot)
        if room.phase in (DecodePhase.TRANSFER, DecodePhase.ABORTING) and not room_released:
            self.receiver.release(room.req.room)
        t = room.t
        t["ended"] = time.time()
        timings = {"total_s": t["ended"] - t["arrived"]}
        for name, a, b in (("prealloc_s", "arrived", "reserved"), ("kv_wait_s", "reserved", "kv_arrived"),
                           ("first_step_s", "first_token", "first_step")):
            if a in t and b in t:
                timings[name] = t[b] - t[a]
        self.streams.push(TokenChunk(chunk.request_id, chunk.token_ids, True, chunk.finish_reason, chunk.error,
                                     chunk.num_cached_tokens, timings))

    # -- load and introspection ---------------------------------------------------------------------------
    def _waiting_outside_engine(self) -> int:
        return sum(1 for r in self.rooms.values() if r.phase in (DecodePhase.PREALLOC, DecodePhase.TRANSFER))

    def _inflight(self) -> int:
        return sum(1 for r in self.rooms.values() if r.phase == DecodePhase.TRANSFER)

    def _extra_stats(self) -> dict:
        phases = {p.value: 0 for p in DecodePhase}
        for r in self.rooms.values():
            phases[r.phase.value] += 1
        return {"queues": phases, "transfer": asdict(self.receiver.stats())}

    def _extra_idle(self) -> dict:
        return {"rooms": len(self.rooms), "endpoint_rooms": self.receiver.stats().rooms,
                "aux_in_use": len(self.aux.buffer) - self.aux.num_free}

    def _close(self) -> None:
        self.receiver.close()
