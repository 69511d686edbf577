"""PrefillDuty: an engine in prefill mode plus a KVSender, the duty a PrefillNode (prefill_node.py)
and a flex node serve. One room per request, keyed by the room id the caller minted (the decode
node knows the same id).

    prefill(req) ─> BootstrapStage ─destination arrived (or early), aux slot─> WaitingStage ─first token─> InflightStage
        │               │ room FAILED                                  │ room FAILED               │ room terminal
        │               v                                              v                           v
        │         PrefillResult(error)                          PrefillResult(error)    PrefillResult(ok / error)
        └─ max_waiting_requests already wait in the engine's queue:
             ├─ it ranks before the one of them that would start last (Scheduler.displaced_by: priority,
             │  then tenant share; only one that never started, in WaitingStage)
             │     ─> taken; that one is aborted in WaitingStage ─room terminal─> PrefillResult(overloaded)
             │        (its decode side hears the room fail; the caller treats it as a refusal)
             └─ otherwise ─> PrefillResult(overloaded) at once, no room opened (the caller aborts the
                decode side)
    abort(request_id): the stage holding the request aborts its room (WaitingStage also frees the
                       engine request at once); the request ends when the room is terminal, error "aborted ..."
                       An abort that came before its request (node/early_aborts.py): the request is
                       answered at once with the abort's reason, no room opened.
    The first token goes to the caller as WaitingStage hands the request on, before its KV leaves
    (NodeRequest.early_first_token), unless it ends the request.

Each stage's module draws its part. A tick visits only the stages holding requests; the engine's
step outputs move requests from WaitingStage to InflightStage. Blocks of an INFLIGHT request are never
freed before the sender says no byte can still move (room terminal): the transport may be reading them.
"""
from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from raypd.engine.outputs import StepOutput
from raypd.kvtransfer import KVReceiver, KVSender, TransferState
from raypd.node.aux_slots import AuxSlots
from raypd.node.node_core import NodeCore
from raypd.node.node_duty import DutyLoad
from raypd.node.streams import Reply
from raypd.prefill_node.bootstrap_stage import BootstrapStage
from raypd.prefill_node.inflight_stage import InflightStage
from raypd.prefill_node.kv_write_log import KVWriteLog
from raypd.prefill_node.prefill_request import PrefillPhase, PrefillRequest
from raypd.prefill_node.prefix_copy import PrefixCopies
from raypd.prefill_node.waiting_stage import WaitingStage
from raypd.protocol.messages import NodeRequest, PrefillResult, TokenChunk

P = PrefillPhase


class PrefillDuty:
    """The prefill duty on `core` (node/node_duty.py's NodeDuty), with its endpoints named after `name`."""

    def __init__(self, core: NodeCore, name: str, transfer_options: dict | None = None, aux_slots: int = 256,
                 max_early_prefills: int = 8):
        """`max_early_prefills`: requests that may compute before their decode node's destination
        arrived (bootstrap_stage.py says why; 0: each waits for it, as SGLang's prefill does)."""
        if max_early_prefills < 0:
            raise ValueError(f"max_early_prefills must be >= 0, got {max_early_prefills}")
        self.max_early_prefills = max_early_prefills
        self.core, self.name = core, name
        engine = core.engine
        self.transfer_config = core.transfer_config(transfer_options)
        self.aux = AuxSlots(aux_slots, engine.device)
        self.sender = KVSender(engine.kv_cache.pool, self.aux.buffer, self.transfer_config, name=name)
        # Receives prefixes other prefill nodes copy here (migration); the same pool, its own endpoint.
        self.receiver = KVReceiver(engine.kv_cache.pool, self.aux.buffer, self.transfer_config, name=f"{name}-import")
        self.copies = PrefixCopies(engine, self.sender, self.receiver)
        self.bootstrap = BootstrapStage(self.sender, self.aux)
        self.waiting = WaitingStage(engine, self.sender, self.aux)
        self.inflight = InflightStage(engine, self.sender, self.aux)
        self._stages: dict[P, BootstrapStage | WaitingStage | InflightStage] = {
            P.BOOTSTRAP: self.bootstrap, P.WAITING: self.waiting, P.INFLIGHT: self.inflight}
        self.requests: dict[str, PrefillRequest] = {}  # every request on the node, whichever its stage
        self.num_completed = 0
        self.kv_writes = KVWriteLog()  # recent requests' KV write times, for stats()
        self.num_failed = 0
        # Back-pressure: while the engine's last step left this many waiting (no prefill slot or no
        # memory for them), the next request is refused at once (HTTP 429 at the ingress). Requests
        # in BootstrapStage are not counted: they wait for their decode side, whose own bound limits
        # them, and a burst the decode side takes within milliseconds must not be refused here. A
        # newcomer that ranks before a waiting request takes its place instead (_add).
        self.max_waiting = engine.config.waiting_limit
        self.num_refused = 0     # refusals for capacity, displaced requests included (as at the ingress)
        self.num_displaced = 0

    # -- from the actor's event loop: what a node's Ray-callable methods await -----------------------
    async def prefill(self, req: NodeRequest) -> PrefillResult:
        """Serve the request's prefill and KV transfer; returns when its room has ended, either way."""
        reply = self.core.reply()
        self.core.loop.call(self._add, req, reply)
        return await self.core.wait(reply)

    async def export_prefix(self, token_ids: list[int], room: int, target_node: str = "") -> PrefillResult:
        """Write the cached blocks of token_ids to the node importing room `room` (prefix_copy.py)."""
        reply = self.core.reply()
        self.core.loop.call(self.copies.export, list(token_ids), room, reply)
        return await self.core.wait(reply)

    async def import_prefix(self, token_ids: list[int], room: int, source_bootstrap_address: str) -> PrefillResult:
        """Receive the blocks of token_ids from the node exporting room `room` into this prefix cache."""
        reply = self.core.reply()
        self.core.loop.call(self.copies.import_, list(token_ids), room, source_bootstrap_address, reply)
        return await self.core.wait(reply)

    async def abort_migration(self, room: int) -> None:
        await self.core.call(self.copies.abort, room)

    def ready_info(self) -> dict[str, Any]:
        return {"bootstrap_address": self.sender.bootstrap_address}

    def close(self) -> None:
        self.sender.close()
        self.receiver.close()

    # -- engine thread ----------------------------------------------------------------------------------
    def _add(self, req: NodeRequest, reply: Reply) -> None:
        rid = req.request_id
        if rid in self.requests:
            reply.set(PrefillResult(rid, False, f"request id {rid!r} is already on this node", no_room=True))
            return
        if (reason := self.core.early_aborts.take(rid)) is not None:
            reply.set(PrefillResult(rid, False, reason, no_room=True))
            return
        waiting = self.core.engine.num_backlogged()
        displaced = None
        if waiting >= self.max_waiting:
            displaced = self.core.engine.displaced_by(req.params, self.waiting)
            if displaced is None:
                self.num_refused += 1
                reply.set(PrefillResult(rid, False, f"prefill node {self.name} is full: {waiting} requests "
                                                    f"already wait for prefill compute (max_waiting_requests)",
                                        overloaded=True))
                return
        pr = PrefillRequest(req, reply, t={"arrived": time.time()})
        try:
            self.core.engine.validate(req.prompt_token_ids, req.params, prefill_only=True)
            self.bootstrap.add(pr)
        except Exception as e:  # bad prompt, duplicate room: the caller aborts the decode side (no_room)
            reply.set(PrefillResult(rid, False, str(e), no_room=True))
            return
        self.requests[rid] = pr
        if displaced is not None:  # only once the newcomer is in: a bad one displaces nobody
            self._displace(self.requests[displaced], rid)

    def _displace(self, pr: PrefillRequest, by: str) -> None:
        """End a waiting request that never started as refused for capacity: `by` took its place."""
        self.num_refused += 1
        self.num_displaced += 1
        pr.overloaded = True
        self.waiting.abort(pr, f"prefill node {self.name} is full: request {by!r} ranks before this one in its "
                               f"queue (priority, then tenant share) and took its place (max_waiting_requests)")

    def abort(self, request_id: str, reason: str) -> bool:
        pr = self.requests.get(request_id)
        if pr is not None and not pr.aborting:
            self._stages[pr.phase].abort(pr, reason)
        return pr is not None

    def tick(self) -> bool:
        # A broken endpoint (kvtransfer's endpoint_health.py) ends the engine thread as a crash does:
        # the node then fails everything it holds and restarts, with a new backend.
        self.sender.raise_if_broken()
        self.receiver.raise_if_broken()
        if self.bootstrap:
            self._end(self.bootstrap.pop_ended())
            for pr in self.bootstrap.pop_ready(self._early_slots()):
                self.waiting.add(pr)
        if self.waiting:
            self._end(self.waiting.pop_ended())
        if self.inflight:
            self._end(self.inflight.pop_ended())
            self._end(self.inflight.pop_ready())
        copying = self.copies.tick()
        return bool(self.requests) or copying

    def _early_slots(self) -> int:
        """How many more requests may enter the engine before their destination arrived."""
        if not self.max_early_prefills:
            return 0
        early = sum(1 for pr in self.requests.values()
                    if pr.phase > P.BOOTSTRAP and not pr.aborting
                    and self.sender.poll(pr.room) == TransferState.BOOTSTRAPPING)
        return max(0, self.max_early_prefills - early)

    def on_outputs(self, outputs: list[StepOutput]) -> None:
        for pr in self.waiting.pop_ready(outputs):
            self._stream_first_token(pr)
            self.inflight.add(pr)

    def _stream_first_token(self, pr: PrefillRequest) -> None:
        """The caller's copy of the first token, sent with this step's flush, before the KV write is
        posted (NodeRequest.early_first_token): its TTFT then pays neither the transfer nor the
        decode node's step boundary. Not when the token ends the request: the decode node's final
        chunk carries it, and a stop token must not reach the caller as text."""
        req = pr.req
        if req.early_first_token and req.reply_address and \
                not self.core.engine.ends_with(pr.request_id, pr.first_token):   # the engine holds it, prefilled
            self.core.streams.post(req.reply_address, TokenChunk(pr.request_id, (pr.first_token,),
                                                                 num_cached_tokens=pr.num_cached_tokens, early=True))

    def _end(self, ended: list[PrefillRequest]) -> None:
        """Answer the callers of requests that left their last stage (the stage freed them)."""
        now = time.time()
        for pr in ended:
            del self.requests[pr.request_id]
            pr.t["ended"] = now
            timings = pr.timings()
            if pr.error is None:
                self.num_completed += 1
                self.kv_writes.record(pr.request_id, timings)
            elif not pr.overloaded:  # a displaced request is counted as refused (_displace), not as failed
                self.num_failed += 1
            pr.reply.set(PrefillResult(pr.request_id, pr.error is None, pr.error, pr.num_cached_tokens,
                                       timings, overloaded=pr.overloaded))

    # -- load and introspection ---------------------------------------------------------------------------
    def load(self) -> DutyLoad:
        b = self.bootstrap
        by_priority = b.prompt_tokens_by_priority()
        return DutyLoad(waiting=len(b) - b.num_aborting, queued_tokens=sum(t for _, t in by_priority),
                        inflight=len(self.inflight) - self.inflight.num_aborting, queued_by_priority=by_priority)

    def role_stats(self) -> dict[str, Any]:
        b, w, f = self.bootstrap, self.waiting, self.inflight
        queues = {"bootstrap": len(b) - b.num_aborting, "queued": len(w) - w.num_aborting,
                  "inflight": len(f) - f.num_aborting, "aborting": b.num_aborting + w.num_aborting + f.num_aborting}
        c = self.copies
        return {"queues": queues, "completed": self.num_completed, "failed": self.num_failed,
                "refused": self.num_refused, "displaced": self.num_displaced,
                # which transports the sender's writes take (TransferBackend.transports; off by default)
                "transfer": {**asdict(self.sender.stats()), "transports": asdict(self.sender.backend.transports())},
                "prefix_copies": {"exported": c.num_exported, "imported": c.num_imported, "failed": c.num_failed},
                "kv_writes": self.kv_writes.stats()}

    def still_held(self) -> dict[str, int]:
        """Rooms, endpoint rooms, prefix copies and aux slots in use (zeros when idle)."""
        return {"rooms": len(self.requests),
                "endpoint_rooms": self.sender.stats().rooms + self.receiver.stats().rooms,
                "copies": len(self.copies.exports) + len(self.copies.imports),
                "aux_in_use": len(self.aux.buffer) - self.aux.num_free}
