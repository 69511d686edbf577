"""What the engine hands back: per-step deltas and whole completions."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepOutput:
    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None  # "stop", "length", "abort"; "prefilled" for a prefill-only request
    num_cached_tokens: int


@dataclass(frozen=True, slots=True)
class CompletionOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    num_cached_tokens: int


@dataclass(frozen=True, slots=True)
class BlockAccounting:
    total: int
    free: int
    cached: int  # stored in the prefix cache (possibly also used by requests)
    held: int  # used by requests only, not in the prefix cache

    @property
    def balanced(self) -> bool:
        return self.free + self.cached + self.held == self.total
