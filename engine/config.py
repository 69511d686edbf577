"""Engine options: one frozen dataclass, validated once."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from raypd.engine.errors import ConfigError


@dataclass(frozen=True, slots=True)
class EngineConfig:
    block_size: int = 16
    num_blocks: int | None = None  # None: as many as kv_cache_memory_mb holds (capped, see engine)
    kv_cache_memory_mb: int = 1024
    chunked_prefill_size: int = 256  # <= 0 disables chunking
    max_num_batched_tokens: int = 512
    max_running_requests: int = 64
    # Admission bound of the node that owns this engine, read by the node (the scheduler never
    # refuses): how many of its requests may wait to run (decode: for KV memory; prefill and mixed:
    # in this engine's waiting queue). The next one is refused at once (the ingress answers 429).
    # None: max_running_requests.
    max_waiting_requests: int | None = None
    schedule_policy: Literal["fcfs", "lpm"] = "fcfs"
    enable_prefix_cache: bool = True
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "auto"  # "auto": cuda when available, else cpu
    num_threads: int | None = None  # torch intra-op threads; None leaves torch's default
    # CPU fast paths: decode attention that reads KV blocks in place (native_attention.py, float32)
    # and projections on prepacked oneDNN weights (linear.py). "torch": plain torch ops only (any
    # device; the reference path). "native": require both, error if unavailable. "auto": each one
    # where it applies, else torch.
    cpu_kernels: Literal["auto", "native", "torch"] = "auto"
    seed: int = 0  # draws the sampling seed of each request that brings none
    # Share of running requests' remaining max_tokens kept free at admission (decays to the minimum
    # each step, jumps back after a retraction). Lower admits more and risks retraction.
    init_new_token_ratio: float = 0.7
    min_new_token_ratio: float = 0.1

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_batched_tokens", "max_running_requests", "kv_cache_memory_mb"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ConfigError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if self.max_waiting_requests is not None and self.max_waiting_requests < 1:
            raise ConfigError(f"max_waiting_requests must be >= 1, got {self.max_waiting_requests}")
        if self.schedule_policy not in ("fcfs", "lpm"):
            raise ConfigError(f"schedule_policy must be 'fcfs' or 'lpm', got {self.schedule_policy!r}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if not 0 <= self.min_new_token_ratio <= self.init_new_token_ratio <= 1:
            raise ConfigError("need 0 <= min_new_token_ratio <= init_new_token_ratio <= 1, got "
                              f"{self.min_new_token_ratio} and {self.init_new_token_ratio}")
        if self.cpu_kernels not in ("auto", "native", "torch"):
            raise ConfigError(f"cpu_kernels must be auto, native or torch, got {self.cpu_kernels!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ConfigError(f"num_threads must be >= 1, got {self.num_threads}")

    @property
    def waiting_limit(self) -> int:
        """max_waiting_requests, or max_running_requests when unset."""
        return self.max_running_requests if self.max_waiting_requests is None else self.max_waiting_requests
