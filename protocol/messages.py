"""What crosses an actor boundary between the caller (launcher, ingress), the nodes and the Conductor.

Plain frozen dataclasses: Ray serializes them between trusted actors. Token streams go over pyzmq
(node/streams.py), so TokenChunk also has an explicit msgpack form, decoded strictly (never pickle);
the KV bytes and the bootstrap handshake go through kvtransfer's msgpack schema.
Imports no torch, so the Conductor can use these too.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import msgpack

from raypd.protocol.kv_events import KVEvent
from raypd.protocol.queued_by_priority import QueuedByPriority, tokens_behind
from raypd.protocol.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class HostInfo:
    node_id: str       # Ray node id of the machine the actor runs on
    ip: str
    hostname: str
    pid: int


@dataclass(frozen=True, slots=True)
class NodeRequest:
    request_id: str
    room: int                      # 63-bit id minted once per request; both PD sides key on it
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    bootstrap_address: str = ""    # decode side: the prefill node's kvtransfer bootstrap endpoint
    reply_address: str = ""        # decode / mixed: the caller's zmq PULL socket for the tokens ("": none)
    # decode side: no prefill node; the decode node prefills the prompt itself, chunked into its own
    # steps under its per-step prompt budget (the Conductor's local path, conductor/split_or_local.py)
    local_prefill: bool = False
    # PD, both sides: the prefill node also streams the first token to reply_address the moment it
    # samples it (TokenChunk.early), before the KV leaves; the decode node streams it again once the
    # KV landed, and the caller keeps whichever copy comes first (cluster/client/token_receiver.py).
    early_first_token: bool = False


# The finish reason of a request a node refused for want of capacity (its bounded waiting queue was
# full, a newcomer ranking before it took its place there before it started, or it waited its bound
# for KV memory). Its final chunk also carries an error saying why; nothing of the request is held
# anywhere. Not a fault: callers answer "retry later" (HTTP 429).
OVERLOADED = "overloaded"


@dataclass(frozen=True, slots=True)
class TokenChunk:
    """One streamed message. The last one of a request has finished=True and either a finish_reason
    ("stop", "length", "abort") or an error; a stream never ends without one. A refusal for want of
    capacity has both: finish_reason OVERLOADED and the error."""
    request_id: str
    token_ids: tuple[int, ...]
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    num_cached_tokens: int = 0     # prompt tokens served from the prefix cache (prefill side's in PD)
    timings: dict = field(default_factory=dict)  # on the last chunk: seconds per lifecycle phase
    # On an error final: the node the caller's driver holds responsible (retries avoid it, circuit
    # breakers count it). Set on the caller's side only; never on the wire.
    failed_node: str = ""
    # The prefill node's copy of a PD request's first token (NodeRequest.early_first_token), sent
    # outside the decode node's stream: never final, not counted in StreamEnd.num_tokens.
    early: bool = False
    # Where its tokens start in the stream: how many the node sent before them (node/streams.py sets
    # it; an early copy's is 0). The receiver checks it, so a lost message is a gap it sees, never a
    # hole in the text. -1: not known (a sender from before offsets).
    offset: int = -1

    def to_wire(self) -> list:
        return [self.request_id, list(self.token_ids), self.finished, self.finish_reason, self.error,
                self.num_cached_tokens, self.timings, self.early, self.offset]

    @classmethod
    def from_wire(cls, w: object) -> TokenChunk:
        """The inverse of to_wire() (a 7- or 8-item array, without `early` or `offset`, too); anything
        else raises ValueError."""
        if not isinstance(w, (list, tuple)) or len(w) not in (7, 8, 9):
            raise ValueError(f"a token chunk is a 7- to 9-item array, got {type(w).__name__}")
        rid, tokens, finished, reason, error, cached, timings, *rest = w
        early = rest[0] if rest else False
        offset = rest[1] if len(rest) > 1 else -1
        if not (isinstance(rid, str) and isinstance(tokens, (list, tuple)) and all(type(t) is int for t in tokens)
                and isinstance(finished, bool) and isinstance(reason, (str, type(None)))
                and isinstance(error, (str, type(None))) and type(cached) is int and isinstance(timings, dict)
                and all(isinstance(k, str) and type(v) in (int, float) for k, v in timings.items())
                and isinstance(early, bool) and not (early and finished) and type(offset) is int and offset >= -1):
            raise ValueError(f"malformed token chunk for request {rid!r}")
        return cls(rid, tuple(tokens), finished, reason, error, cached, dict(timings), early=early, offset=offset)


TOKEN_WIRE_VERSION = 1


def pack_chunks(chunks: list[TokenChunk]) -> bytes:
    """One token-stream message: [version, [chunk, ...]], every chunk of one engine step for one caller."""
    return msgpack.packb([TOKEN_WIRE_VERSION, [c.to_wire() for c in chunks]])


def unpack_chunks(data: bytes) -> list[TokenChunk]:
    """Strict inverse of pack_chunks(): a malformed message raises ValueError."""
    try:
        msg = msgpack.unpackb(data)
    except Exception as e:  # msgpack raises several unrelated types on bad input
        raise ValueError(f"not a msgpack message: {e}") from e
    if not isinstance(msg, list) or len(msg) != 2 or msg[0] != TOKEN_WIRE_VERSION or not isinstance(msg[1], list):
        raise ValueError(f"not a version-{TOKEN_WIRE_VERSION} token-stream message")
    return [TokenChunk.from_wire(w) for w in msg[1]]


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """What generate() on a decode or mixed node returns once the request ended. `final` is the final
    chunk, also sent on the token stream; `num_tokens` counts every token the stream carried, the
    final chunk's included, so the caller knows when it holds them all (the stream and the Ray
    return are not ordered)."""
    final: TokenChunk
    num_tokens: int


@dataclass(frozen=True, slots=True)
class PrefillResult:
    """The prefill node's answer for one request, once its room ended."""
    request_id: str
    ok: bool
    error: str | None = None
    num_cached_tokens: int = 0
    timings: dict = field(default_factory=dict)
    overloaded: bool = False  # refused for want of capacity (see OVERLOADED): at once, no room opened; or
                              # displaced from the full queue before it started, its room failed
    no_room: bool = False     # refused before any room was opened (a bad prompt, a duplicate id): no KV will come


@dataclass(frozen=True, slots=True)
class LoadReport:
    node_name: str
    role: str                      # "prefill", "decode", "mixed" or "flex"
    queued_prefill_tokens: int     # prompt tokens not yet computed (bootstrap + waiting + running chunks)
    waiting: int                   # requests not yet running (any queue before the running batch)
    running: int
    free_blocks: int               # free plus evictable cache blocks: what a new request can get
    total_blocks: int
    cached_blocks: int
    inflight: int = 0              # prefill: KV being written; decode: waiting for KV
    step_time_s: float = 0.0       # moving average of one engine step's wall time
    steps: int = 0                 # engine steps run since the node started, and ...
    step_s_total: float = 0.0      # ... their summed wall time: two reports give a window's mean step
    prefill_tokens_per_s: float = 0.0  # measured prefill speed (moving average), for TTFT estimates
    timestamp: float = 0.0
    duty: str = ""                 # a flex node's Duty (protocol/duty.py); "" for a node with a fixed role
    duty_order: float = 0.0        # the stamp of the last duty order it took (the Conductor's clock; 0: none)
    stalled_s: float = 0.0         # how long the engine's current turn has run (a step that never ends grows it)
    kv_bytes_per_token: int = 0    # KV bytes one token takes in the pool (every layer's K and V)
    # KVTier value -> measured bytes/s of loading blocks from that tier into the pool (0: not measured
    # yet); a tier the node does not have is absent
    tier_load_bytes_per_s: dict[int, float] = field(default_factory=dict)
    # queued_prefill_tokens by the priority a new request sees them at (protocol/queued_by_priority.py):
    # it waits behind those at its priority or more urgent. (): not known, every request waits behind
    # all of them (a node from before priorities).
    queued_prefill_by_priority: QueuedByPriority = ()

    def queued_prefill_ahead_of(self, priority: int) -> int:
        """The queued prompt tokens a new request at `priority` waits behind here."""
        return max(0, self.queued_prefill_tokens - tokens_behind(self.queued_prefill_by_priority, priority))


@dataclass(frozen=True, slots=True)
class KVEventBatch:
    node_name: str
    events: tuple[KVEvent, ...]
