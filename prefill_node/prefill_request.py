"""A prefill request on its way through the prefill node's stages, and its ordered phase.

One PrefillRequest per NodeRequest, keyed by request id on the node and by room id in the KVSender.
The stage holding it sets `phase` when it takes it; the stage it ends in frees what it holds (engine
request, aux slot, room) and says why in `error`, so the node only has to answer the caller.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from raypd.kvtransfer.rooms import Room
from raypd.node.streams import Reply
from raypd.protocol.messages import NodeRequest


class PrefillPhase(IntEnum):
    """The stage a request is in. Ordered along the lifecycle, like kvtransfer's TransferState: a
    request only moves up, so the least advanced of several is their min, and what a request holds is
    a comparison (>= WAITING: an aux slot and an engine request; INFLIGHT: blocks the transport may
    be reading until the room is terminal)."""
    BOOTSTRAP = 1   # room open, waiting to enter the engine (for the destination, past the early limit)
    WAITING = 2     # in the engine (waiting, or running chunked prefill), its destination here or not
                    # (early admission); holds an aux slot and blocks
    INFLIGHT = 3    # prefilled: KV and aux record being written, or the write armed until the
                    # destination comes; blocks held until the room is terminal


@dataclass(slots=True, eq=False)
class PrefillRequest:
    req: NodeRequest
    reply: Reply                          # answered by the node once the request left its last stage
    phase: PrefillPhase = PrefillPhase.BOOTSTRAP
    aux_slot: int | None = None
    first_token: int = -1                 # set when prefilled
    num_cached_tokens: int = 0
    abort_reason: str | None = None       # set by abort(): it leaves once its room is terminal
    overloaded: bool = False              # displaced from the full queue: ends as refused for capacity
    error: str | None = None              # why it ended; None: its KV reached the decode node
    record: Room | None = None            # the sender's record of its room, once released
    t: dict[str, float] = field(default_factory=dict)  # time.time() each phase started

    @property
    def request_id(self) -> str:
        return self.req.request_id

    @property
    def room(self) -> int:
        return self.req.room

    @property
    def aborting(self) -> bool:
        return self.abort_reason is not None

    def timings(self) -> dict[str, float]:
        """Seconds per phase from the start times that exist (bootstrap_s: before the engine took
        it, ~0 when admitted early), and the handoff itself by the sender loop's own clock: the write
        armed waiting for a destination that came after the prefill (armed_s, only then), bytes
        moving (kv_write_s), then the receiver's Done (kv_ack_s)."""
        t = self.t
        out = {}
        for name, a, b in (("bootstrap_s", "arrived", "bootstrapped"), ("queue_s", "bootstrapped", "scheduled"),
                           ("prefill_s", "scheduled", "prefilled"), ("transfer_s", "prefilled", "transferred")):
            if a in t and b in t:
                out[name] = max(0.0, t[b] - t[a])
        out["total_s"] = t["ended"] - t["arrived"]
        # transfer_s ends at the engine thread's next look, after whatever step it was running.
        rec = self.record
        if self.error is None and rec is not None and rec.t_posted is not None and rec.t_landed is not None \
                and rec.t_done is not None:
            out["kv_write_s"] = rec.t_landed - rec.t_posted
            out["kv_ack_s"] = rec.t_done - rec.t_landed
            if rec.t_armed is not None:
                out["armed_s"] = rec.t_posted - rec.t_armed
        return out
