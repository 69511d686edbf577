"""Engine options: one frozen dataclass, validated once."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from raypd.engine.errors import ConfigError

# Batch options that default by device kind (engine/device.py says why); an option the caller sets
# always wins. Here, beside EngineConfig, and not in device.py: the serve command reads them to size
# the ingress's admission, and device.py imports torch.
BATCH_DEFAULTS = {
    "cpu": {"chunked_prefill_size": 256, "max_num_batched_tokens": 512, "max_running_requests": 64,
            "yield_step_tokens": 32},
    "cuda": {"chunked_prefill_size": 2048, "max_num_batched_tokens": 8192, "max_running_requests": 256,
             "yield_step_tokens": 512},
}

# What --attention-backend accepts (engine/gpu/backend.py says what each one runs): one list for
# every command that takes the flag.
BACKEND_CHOICES = ("auto", "triton", "flashinfer", "torch")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    block_size: int = 16
    # KV pool size (engine/kv_memory.py): num_blocks when set; else kv_cache_memory_mb when set; else
    # on CPU 1024 MB, and on CUDA what gpu_memory_utilization leaves after the weights and a peak batch.
    num_blocks: int | None = None
    kv_cache_memory_mb: int | None = None
    gpu_memory_utilization: float = 0.9  # vLLM's meaning: share of the GPU's memory this engine may use
    chunked_prefill_size: int = 256  # <= 0 disables chunking
    max_num_batched_tokens: int = 512
    max_running_requests: int = 64
    # Admission bound of the node that owns this engine, read by the node (the scheduler never
    # refuses): how many of its requests may wait to run (decode: for KV memory; prefill and mixed:
    # in this engine's waiting queue). The next one is refused at once (the ingress answers 429).
    # None: max_running_requests.
    max_waiting_requests: int | None = None
    # Order of prompts at admission (engine/scheduler.py): fcfs, lpm (longest cached prefix first) or
    # srpt (shortest remaining prompt first, aged by srpt_aging_tokens_per_s per second waited).
    schedule_policy: Literal["fcfs", "lpm", "srpt"] = "fcfs"
    srpt_aging_tokens_per_s: float = 256.0
    # Prompt tokens a step that also decodes may compute (engine/scheduler.py); None: the whole
    # max_num_batched_tokens. A decode node that prefills prompts itself (the Conductor's local path)
    # sets it, so a local prompt adds at most this much to each step of its running requests; a step
    # without decodes is not capped.
    max_prefill_tokens_per_step: int | None = None
    # Yielding steps (engine/step_yield.py): while requests of more than one (priority, tenant) came
    # within yield_window_s, a step holds at most this many prompt tokens of the classes that rank
    # after the first, and none while one of the first class's prompts can run: an urgent or owed
    # request waits for one small step at most. 0: nothing yields (steps by the budget alone).
    yield_step_tokens: int = 32
    yield_window_s: float = 30.0
    enable_prefix_cache: bool = True
    # KV tiers below the pool (engine/cache/kv_tiers.py): host memory (kv_host_tier_size_mb, pinned
    # on a GPU; 0: none), then a directory on disk (kv_tier_dir, at most kv_tier_size_mb; None: none).
    # Blocks go down on eviction ("write-back") or at their kv_tier_write_through_hits-th match
    # ("write-through-selective") and are loaded back when a prompt's prefix runs into them.
    kv_tier_dir: str | None = None
    kv_tier_size_mb: int = 4096
    kv_host_tier_size_mb: int = 0
    kv_tier_policy: Literal["write-back", "write-through-selective"] = "write-back"
    kv_tier_write_through_hits: int = 2
    # engine/device.py: "auto" is float32 on CPU (the parity reference) and bfloat16 on CUDA.
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: str = "auto"  # "auto": cuda when available, else cpu (a node actor passes the GPU Ray gave it)
    num_threads: int | None = None  # torch intra-op threads; None leaves torch's default
    # CPU fast paths: decode attention that reads KV blocks in place (native_attention.py, float32)
    # and projections on prepacked oneDNN weights (linear.py). "torch": plain torch ops only (any
    # device; the reference path). "native": require both, error if unavailable. "auto": each one
    # where it applies, else torch.
    cpu_kernels: Literal["auto", "native", "torch"] = "auto"
    # Weight format of the projections and the LM head (engine/model/quantization.py), activations in
    # `dtype`. "int8": one scale per output channel (a quarter of float32's bytes per decode step);
    # "int8-g32": a scale and an offset per 32 weights (1.25 bytes each), which reproduces a GGUF's
    # 4-bit and 8-bit groups exactly. Greedy tokens from "int8" drift from the float32 reference.
    quantization: Literal["none", "int8", "int8-g32"] = "none"
    # Attention and layer kernels (engine/gpu/backend.py): "triton" reads KV blocks in place with the
    # Triton kernels and fuses the norms, rotary and SwiGLU (CUDA; on a CPU only under Triton's
    # interpreter, for tests); "flashinfer" FlashInfer's paged kernels for attention (CUDA, bf16/fp16,
    # when flashinfer-python is installed) with the rest on Triton; "torch" the reference path;
    # "auto" is triton on CUDA when Triton imports, else torch.
    attention_backend: Literal["auto", "triton", "flashinfer", "torch"] = "auto"
    # CUDA graphs for decode-only steps (engine/gpu/cuda_graphs.py) are captured on CUDA with the
    # triton and flashinfer backends unless this is set.
    enforce_eager: bool = False
    # Overlap scheduling (engine/overlap.py): greedy decode-only steps replayed from the graphs are
    # scheduled and launched while the GPU still runs the previous one. This turns it off.
    disable_overlap_schedule: bool = False
    seed: int = 0  # draws the sampling seed of each request that brings none
    # Share of running requests' remaining max_tokens kept free at admission (decays to the minimum
    # each step, jumps back after a retraction). Lower admits more and risks retraction.
    init_new_token_ratio: float = 0.7
    min_new_token_ratio: float = 0.1

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_batched_tokens", "max_running_requests"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.kv_cache_memory_mb is not None and self.kv_cache_memory_mb < 1:
            raise ConfigError(f"kv_cache_memory_mb must be >= 1, got {self.kv_cache_memory_mb}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ConfigError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if self.max_waiting_requests is not None and self.max_waiting_requests < 1:
            raise ConfigError(f"max_waiting_requests must be >= 1, got {self.max_waiting_requests}")
        if self.max_prefill_tokens_per_step is not None:
            if self.max_prefill_tokens_per_step < 1:
                raise ConfigError(f"max_prefill_tokens_per_step must be >= 1, got {self.max_prefill_tokens_per_step}")
            if self.chunked_prefill_size <= 0:  # an unchunked prompt cannot be held to a per-step cap
                raise ConfigError("max_prefill_tokens_per_step needs chunked prefill (chunked_prefill_size > 0)")
        if self.yield_step_tokens < 0:
            raise ConfigError(f"yield_step_tokens must be >= 0, got {self.yield_step_tokens}")
        if not self.yield_window_s > 0:
            raise ConfigError(f"yield_window_s must be > 0, got {self.yield_window_s}")
        if self.schedule_policy not in ("fcfs", "lpm", "srpt"):
            raise ConfigError(f"schedule_policy must be 'fcfs', 'lpm' or 'srpt', got {self.schedule_policy!r}")
        if not self.srpt_aging_tokens_per_s > 0:
            raise ConfigError(f"srpt_aging_tokens_per_s must be > 0, got {self.srpt_aging_tokens_per_s}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if not 0 <= self.min_new_token_ratio <= self.init_new_token_ratio <= 1:
            raise ConfigError("need 0 <= min_new_token_ratio <= init_new_token_ratio <= 1, got "
                              f"{self.min_new_token_ratio} and {self.init_new_token_ratio}")
        if self.cpu_kernels not in ("auto", "native", "torch"):
            raise ConfigError(f"cpu_kernels must be auto, native or torch, got {self.cpu_kernels!r}")
        if self.quantization not in ("none", "int8", "int8-g32"):
            raise ConfigError(f"quantization must be none, int8 or int8-g32, got {self.quantization!r}")
        if self.kv_tier_size_mb < 1:
            raise ConfigError(f"kv_tier_size_mb must be >= 1, got {self.kv_tier_size_mb}")
        if self.kv_host_tier_size_mb < 0:
            raise ConfigError(f"kv_host_tier_size_mb must be >= 0, got {self.kv_host_tier_size_mb}")
        if self.tiered and not self.enable_prefix_cache:
            raise ConfigError("a KV tier holds what the prefix cache evicts: it needs enable_prefix_cache")
        if self.kv_tier_policy not in ("write-back", "write-through-selective"):
            raise ConfigError("kv_tier_policy must be write-back or write-through-selective, "
                              f"got {self.kv_tier_policy!r}")
        if self.kv_tier_write_through_hits < 1:
            raise ConfigError(f"kv_tier_write_through_hits must be >= 1, got {self.kv_tier_write_through_hits}")
        if self.attention_backend not in BACKEND_CHOICES:
            raise ConfigError(f"attention_backend must be one of {', '.join(BACKEND_CHOICES)}, "
                              f"got {self.attention_backend!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ConfigError(f"num_threads must be >= 1, got {self.num_threads}")

    @property
    def tiered(self) -> bool:
        """Whether any KV tier below the pool is configured."""
        return self.kv_tier_dir is not None or self.kv_host_tier_size_mb > 0

    @property
    def waiting_limit(self) -> int:
        """max_waiting_requests, or max_running_requests when unset."""
        return self.max_running_requests if self.max_waiting_requests is None else self.max_waiting_requests
