"""What crosses an actor boundary between the caller (launcher, ingress), the nodes and the Conductor.

Plain frozen dataclasses: Ray serializes them between trusted actors; nothing here is unpickled
from the network (the KV bytes and the bootstrap handshake go through kvtransfer's msgpack schema).
Imports no torch, so the Conductor can use these too.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.kv_events import KVEvent
from engine.sampling_params import SamplingParams


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


@dataclass(frozen=True, slots=True)
class TokenChunk:
    """One streamed message. The last one of a request has finished=True and either a finish_reason
    ("stop", "length", "abort") or an error; a stream never ends without one."""
    request_id: str
    token_ids: tuple[int, ...]
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    num_cached_tokens: int = 0     # prompt tokens served from the prefix cache (prefill side's in PD)
    timings: dict = field(default_factory=dict)  # on the last chunk: seconds per lifecycle phase


@dataclass(frozen=True, slots=True)
class PrefillResult:
    """The prefill node's answer for one request, once its room ended."""
    request_id: str
    ok: bool
    error: str | None = None
    num_cached_tokens: int = 0
    timings: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LoadReport:
    node_name: str
    role: str                      # "prefill", "decode" or "mixed"
    queued_prefill_tokens: int     # prompt tokens not yet computed (bootstrap + waiting + running chunks)
    waiting: int                   # requests not yet running (any queue before the running batch)
    running: int
    free_blocks: int               # free plus evictable cache blocks: what a new request can get
    total_blocks: int
    cached_blocks: int
    inflight: int = 0              # prefill: KV being written; decode: waiting for KV
    step_time_s: float = 0.0       # moving average of one engine step's wall time
    prefill_tokens_per_s: float = 0.0  # measured prefill speed (moving average), for TTFT estimates
    timestamp: float = 0.0


@dataclass(frozen=True, slots=True)
class KVEventBatch:
    node_name: str
    events: tuple[KVEvent, ...]
