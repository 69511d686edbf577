"""DecodeDuty: an engine in decode mode plus a KVReceiver, the duty a DecodeNode (decode_node.py) and a
flex node serve. One room per request, keyed by the room id the caller minted (the prefill node
knows the same id).

    generate(req) ─> PreallocStage ─blocks reserved, aux slot─> TransferStage ─KV landed─> RunningStage
        │                │ prealloc timeout                          │ room FAILED            │ stop / length
        │                v                                           v                        v
        │          final chunk (overloaded)                  final chunk (error)    final chunk (finish_reason)
        └─ max_waiting_requests already wait for KV memory (PreallocStage, and local prompts the engine left waiting):
             ├─ it ranks before the one of them that would start last (Scheduler.displaced_by: priority,
             │  then tenant share; one in PreallocStage or a local one that never started)
             │     ─> taken; that one leaves its stage ─> final chunk (overloaded), nothing held
             └─ otherwise ─> final chunk (overloaded) at once, nothing held
    generate(req with local_prefill) ─> RunningStage (the engine prefills it here, in chunks under
        its per-step prompt budget, then decodes) ─> final chunk; no room, no KV transfer
    abort(request_id): PREALLOC / RUNNING ─> final chunk "abort" at once;
                       TRANSFER ─> the receiver aborts the room ─room terminal─> final chunk "abort"

Each stage's module draws its part. A tick visits only the stages holding requests; the engine's
step outputs drive RunningStage. Reserved blocks are freed only when the room is terminal: until then
the prefill node may be writing. Every path ends with exactly one final chunk, so a caller is never
left waiting in silence. Tokens go to req.reply_address over pyzmq (node/streams.py); generate()
returns the StreamEnd over Ray.
"""
from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from raypd.decode_node.decode_request import DecodePhase, DecodeRequest
from raypd.decode_node.prealloc_stage import PreallocStage
from raypd.decode_node.running_stage import RunningStage
from raypd.decode_node.transfer_stage import TransferStage
from raypd.engine.errors import InvalidRequestError
from raypd.engine.outputs import StepOutput
from raypd.kvtransfer import KVReceiver
from raypd.node.aux_slots import AuxSlots
from raypd.node.node_core import NodeCore
from raypd.node.node_duty import DutyLoad
from raypd.protocol.messages import OVERLOADED, NodeRequest, StreamEnd, TokenChunk

P = DecodePhase


class DecodeDuty:
    """The decode duty on `core` (node/node_duty.py's NodeDuty), its KV receiver named `receiver_name`."""

    def __init__(self, core: NodeCore, name: str, transfer_options: dict | None = None, aux_slots: int = 256,
                 prealloc_timeout_s: float | None = None, receiver_name: str | None = None):
        """`receiver_name`: the KV receiver's name, unique among the deployment's endpoints (a flex
        node's sender already goes by the node's name); the node's name by default."""
        self.core, self.name = core, name
        engine = core.engine
        self.transfer_config = cfg = core.transfer_config(transfer_options)
        self.aux = AuxSlots(aux_slots, engine.device)
        self.receiver = KVReceiver(engine.kv_cache.pool, self.aux.buffer, cfg, name=receiver_name or name)
        # The prefill side waits bootstrap_timeout_s for our destination, so waiting longer for
        # memory here would only reserve blocks for a room the prefill node has already dropped.
        self.prealloc_timeout_s = min(prealloc_timeout_s or cfg.bootstrap_timeout_s, cfg.bootstrap_timeout_s)
        self.prealloc = PreallocStage(engine, self.aux, self.prealloc_timeout_s)
        self.transfer = TransferStage(engine, self.receiver, self.aux)
        self.running = RunningStage(engine, core.streams)
        self.requests: dict[str, DecodeRequest] = {}  # every request on the node, whichever its stage
        # Back-pressure: at most this many wait for KV memory; the next is refused at once (HTTP 429
        # at the ingress) instead of waiting out the prealloc timeout behind them, unless it ranks
        # before one of them, which it then displaces (_add).
        self.max_waiting = engine.config.waiting_limit
        self.num_refused = 0     # refusals for capacity, displaced requests included (as at the ingress)
        self.num_displaced = 0
        self.num_local = 0   # requests prefilled here (local_prefill), since the start

    # -- from the actor's event loop --------------------------------------------------------------------
    async def generate(self, req: NodeRequest) -> StreamEnd:
        """Decode a request whose prefill runs on the node at req.bootstrap_address (or here, when
        req.local_prefill), streaming its tokens to req.reply_address; return once it ended (the
        final chunk and how many tokens the stream carried)."""
        return await self.core.stream(req, self._add, self.abort)

    def ready_info(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        self.receiver.close()

    # -- engine thread ----------------------------------------------------------------------------------
    def _add(self, req: NodeRequest) -> None:
        rid = req.request_id
        try:
            if rid in self.requests or rid in self.core.engine.requests:
                raise InvalidRequestError(f"request id {rid!r} is already on this node", "request_id")
            if not req.bootstrap_address and not req.local_prefill:
                raise InvalidRequestError("a decode request needs the prefill node's bootstrap address",
                                          "bootstrap_address")
            self.core.engine.validate(req.prompt_token_ids, req.params)
        except InvalidRequestError as e:
            self.core.streams.push(TokenChunk(rid, (), finished=True, error=str(e)))
            return
        # Local prompts the last step left waiting wait for memory as much as prealloc's do.
        displaced = None
        if (blocked := self.prealloc.num_blocked + self.core.engine.num_backlogged()) >= self.max_waiting:
            displaced = self.core.engine.displaced_by(req.params, self.running, self.prealloc.queued())
            if displaced is None:
                self.num_refused += 1
                self.core.streams.push(TokenChunk(
                    rid, (), True, OVERLOADED, f"decode node {self.name} is full: {blocked} requests already "
                                               f"wait for KV memory (max_waiting_requests)"))
                return
        dr = DecodeRequest(req, t={"arrived": time.time()})
        if req.local_prefill:
            self.running.add_local(dr)  # validated above: the engine takes it
            self.num_local += 1
        else:
            self.prealloc.add(dr)
        self.requests[rid] = dr
        if displaced is not None:
            self._displace(self.requests[displaced], rid)

    def _displace(self, dr: DecodeRequest, by: str) -> None:
        """End a request waiting for KV memory that never started (it holds nothing) as refused for
        capacity: `by` took its place. A PD request's prefill side is aborted by its caller, as after
        any refusal here."""
        self.num_refused += 1
        self.num_displaced += 1
        (self.prealloc if dr.phase == P.PREALLOC else self.running).remove(dr)
        dr.overloaded = True
        dr.error = (f"decode node {self.name} is full: request {by!r} ranks before this one among those waiting "
                    f"for KV memory (priority, then tenant share) and took its place (max_waiting_requests)")
        self._end(dr)

    def abort(self, request_id: str, reason: str = "aborted by the client") -> bool:
        dr = self.requests.get(request_id)
        if dr is None or dr.aborting:
            return dr is not None
        if dr.phase == P.TRANSFER:
            self.transfer.abort(dr)  # ends once the room is terminal
            return True
        (self.prealloc if dr.phase == P.PREALLOC else self.running).abort(dr)
        self._end(dr)
        return True

    def tick(self) -> bool:
        self.receiver.raise_if_broken()  # ends the engine thread as a crash does (prefill_duty.py's tick)
        if self.prealloc:
            for dr in self.prealloc.pop_ended():
                dr.error = f"no KV memory for the prompt on {self.name} within {self.prealloc.timeout_s:g}s"
                dr.overloaded = True
                self._end(dr)
            for dr in self.prealloc.pop_ready():
                try:
                    self.transfer.add(dr)
                except Exception as e:  # noqa: BLE001 - bad address or room id: this request fails alone
                    dr.error = f"cannot open KV room: {e}"
                    self._end(dr)
        if self.transfer:
            for dr in self.transfer.pop_ended():
                self._end(dr)
            for dr in self.transfer.pop_ready():
                try:
                    self.running.add(dr)
                except InvalidRequestError as e:
                    dr.error = str(e)
                    self._end(dr)
            self._end_finished(self.running.pop_ready())
        return bool(self.prealloc or self.transfer)

    def on_outputs(self, outputs: list[StepOutput]) -> None:
        self._end_finished(self.running.pop_ready(outputs))

    def _end_finished(self, finished: list[tuple[DecodeRequest, StepOutput]]) -> None:
        for dr, out in finished:
            self._end(dr, out)

    def _end(self, dr: DecodeRequest, last: StepOutput | None = None) -> None:
        """Send the final chunk of a request that left its stage (the stage freed it)."""
        del self.requests[dr.request_id]
        dr.t["ended"] = time.time()
        tokens = tuple(last.new_token_ids) if last is not None else ()
        reason = last.finish_reason if last is not None else \
            ("abort" if dr.aborting else OVERLOADED if dr.overloaded else None)
        error = dr.error if reason in (None, OVERLOADED) else None
        self.core.streams.push(TokenChunk(dr.request_id, tokens, True, reason, error, dr.num_cached_tokens,
                                          dr.timings()))

    # -- load and introspection ---------------------------------------------------------------------------
    def load(self) -> DutyLoad:
        transferring = len(self.transfer) - self.transfer.num_aborting
        return DutyLoad(waiting=len(self.prealloc) + transferring, queued_tokens=0, inflight=transferring)

    def role_stats(self) -> dict[str, Any]:
        t = self.transfer
        queues = {"prealloc": len(self.prealloc), "transfer": len(t) - t.num_aborting, "running": len(self.running),
                  "aborting": t.num_aborting}
        return {"queues": queues, "refused": self.num_refused, "displaced": self.num_displaced,
                "local_prefills": self.num_local,
                # the transports of the connections its senders made to it (TransferBackend.transports)
                "transfer": {**asdict(self.receiver.stats()), "transports": asdict(self.receiver.backend.transports())}}

    def still_held(self) -> dict[str, int]:
        """Rooms, endpoint rooms and aux slots in use (zeros when idle)."""
        return {"rooms": len(self.requests), "endpoint_rooms": self.receiver.stats().rooms,
                "aux_in_use": len(self.aux.buffer) - self.aux.num_free}
