"""A decode request on its way through the decode node's stages, and its ordered phase.

One DecodeRequest per NodeRequest, keyed by request id (also the key of its block reservation in
the engine) and by room id in the KVReceiver. The stage holding it sets `phase` when it takes it; a
stage a request ends in frees what it holds and says why in `error`, so the node only has to send the
final chunk.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from raypd.node.aux_slots import AuxRecord
from raypd.protocol.messages import NodeRequest


class DecodePhase(IntEnum):
    """The stage a request is in. Ordered along the lifecycle, like kvtransfer's TransferState: a
    request only moves up, so the least advanced of several is their min, and what a request holds is
    a comparison (< TRANSFER: nothing; TRANSFER: reserved blocks the prefill node may be writing, an
    aux slot and a room; RUNNING: an engine request that owns those blocks)."""
    PREALLOC = 1    # waiting for KV blocks (FIFO, back-pressure); holds nothing
    TRANSFER = 2    # blocks reserved, room open: the prompt's KV and first token are on their way
    RUNNING = 3     # in the engine's batch, streaming a token per step (a local prefill: in the
                    # engine's queues from the start, prefilled here; it holds what the engine gave it)


@dataclass(slots=True, eq=False)
class DecodeRequest:
    req: NodeRequest
    phase: DecodePhase = DecodePhase.PREALLOC
    deadline: float = 0.0                 # PREALLOC: give up after this (time.monotonic())
    blocks: list[int] = field(default_factory=list)  # reserved for the prompt's KV (TRANSFER)
    aux_slot: int | None = None
    record: AuxRecord | None = None       # what the prefill node wrote beside the KV, once it landed
    num_cached_tokens: int = 0            # prompt tokens the prefill node (local: this node) served from its cache
    local: bool = False                   # prefilled on this node (NodeRequest.local_prefill): no room, no KV transfer
    aborting: bool = False                # abort() asked: it ends with finish_reason "abort"
    overloaded: bool = False              # waited its bound for KV memory, or displaced by a newcomer before
                                          # it started: ends with finish_reason OVERLOADED
    error: str | None = None              # why it failed, set by the stage it ended in
    t: dict[str, float] = field(default_factory=dict)  # time.time() of each event

    @property
    def request_id(self) -> str:
        return self.req.request_id

    @property
    def room(self) -> int:
        return self.req.room

    def timings(self) -> dict[str, float]:
        """Seconds waiting for blocks (prealloc_s), for the KV (kv_wait_s), queued and prefilled here
        until the first token (local_prefill_s, local path only), for the first decode step after the
        first token (first_step_s), and in all (total_s)."""
        t = self.t
        out = {"total_s": t["ended"] - t["arrived"]}
        local = ("local_prefill_s", "arrived", "first_token") if self.local else ("", "", "")
        for name, a, b in (("prealloc_s", "arrived", "reserved"), ("kv_wait_s", "reserved", "kv_arrived"), local,
                           ("first_step_s", "first_token", "first_step")):
            if a in t and b in t:
                out[name] = t[b] - t[a]
        return out
