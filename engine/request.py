"""The request object the scheduler moves between queues, and its lifecycle.

    WAITING --admit--> RUNNING --stop token / EOS--> FINISHED_STOPPED
       ^                  |    --max_tokens / context--> FINISHED_LENGTH
       +----retract-------+
    any state --abort--> FINISHED_ABORTED

A prefill-only request (a PD prefill node's) stops after its first sampled token:

    RUNNING --first token--> PREFILLED --release--> (blocks into the prefix cache, request gone)

PREFILLED keeps the block table and its prefix-cache lock so the KV can be copied to the decode
node; the caller releases it once the copy is done (or failed).

A retracted request drops its KV (full blocks stay in the prefix cache) and recomputes prompt plus
the tokens it had produced, so its output continues exactly where it stopped.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING

from raypd.protocol.sampling_params import SamplingParams

if TYPE_CHECKING:
    from raypd.engine.cache.radix_cache import RadixNode


class RequestStatus(IntEnum):
    WAITING = 0
    RUNNING = 1
    PREFILLED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {RequestStatus.FINISHED_STOPPED: "stop", RequestStatus.FINISHED_LENGTH: "length",
                   RequestStatus.FINISHED_ABORTED: "abort"}


@dataclass(eq=False, slots=True)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    stop_token_ids: frozenset[int]  # EOS ids (unless ignore_eos) plus the request's own
    max_total_tokens: int  # prompt + max_tokens, capped at the model's context length
    token_ids: list[int] = field(default_factory=list)  # prompt then outputs; filled in __post_init__
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0  # tokens whose KV is in block_table
    block_table: list[int] = field(default_factory=list)
    prefix_node: RadixNode | None = None  # the locked radix node covering the cached head of block_table
    num_cached_tokens: int | None = None  # prompt tokens served from cache at first admission
    num_retractions: int = 0
    prefill_only: bool = False  # stop after the first token and hold the KV (PD prefill node)
    first_scheduled_at: float | None = None  # time.time() of first admission (PD timing breakdown)
    queued_at: float = field(default_factory=time.monotonic)  # when it reached the node (srpt's aging)

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)

    @property
    def started(self) -> bool:
        """Whether it ever ran here: admitted once (a retracted or preempted request waits again, having
        started), or joined the running batch with its KV (a PD decode node's). A waiting request that
        never started holds no block and has computed nothing: a node may still turn it away."""
        return self.num_cached_tokens is not None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def generated_token_ids(self) -> list[int]:
        """The tokens this request generated over all its attempts: the prompt's last
        params.num_replayed_tokens (an earlier attempt generated them; failover re-submitted them
        as prompt) and this attempt's outputs. Presence and frequency penalties count these."""
        return self.token_ids[self.num_prompt_tokens - self.params.num_replayed_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def remaining_output_tokens(self) -> int:
        return self.max_total_tokens - self.num_tokens
