"""The engine's flags (the "engine" argument group of `raypd generate` and `raypd serve`) and the
EngineConfig options they give. Each default is EngineConfig's, so a flag left unset changes nothing."""
from __future__ import annotations

import argparse

# EngineConfig's BACKEND_CHOICES (engine/config.py), not imported from there: importing raypd.engine
# loads torch, which `raypd serve`'s command line defers (tests/engine/test_cli.py holds them equal).
BACKEND_CHOICES = ("auto", "triton", "flashinfer", "torch")


def add_engine_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Add the group to `parser` and return it (a command may add flags of its own to it)."""
    e = parser.add_argument_group("engine")
    e.add_argument("--block-size", type=int, default=16)
    e.add_argument("--num-blocks", type=int, default=None,
                   help="KV blocks per engine (default: from --kv-cache-memory or --gpu-memory-utilization)")
    e.add_argument("--kv-cache-memory", type=int, default=None, metavar="MB", dest="kv_cache_memory_mb",
                   help="KV pool size per engine in MiB (default on CPU: 1024; on a GPU: from --gpu-memory-utilization)")
    e.add_argument("--gpu-memory-utilization", type=float, default=None, metavar="F",
                   help="share of the GPU's memory one engine uses for weights, its peak batch and the KV pool "
                        "(default 0.9; vLLM's meaning)")
    # Batch sizes default by device kind (engine/device.py): CPU 256 / 512 / 64, CUDA 2048 / 8192 / 256.
    e.add_argument("--chunked-prefill-size", type=int, default=None, help="<= 0 disables chunking (default: by device)")
    e.add_argument("--max-num-batched-tokens", type=int, default=None, help="tokens per engine step (default: by device)")
    e.add_argument("--max-running-requests", type=int, default=None, help="(default: by device)")
    e.add_argument("--max-waiting-requests", type=int, default=None,
                   help="per node: requests waiting to run beyond which it refuses new ones at once "
                        "(HTTP 429); default: --max-running-requests")
    e.add_argument("--schedule-policy", choices=["fcfs", "lpm", "srpt"], default="fcfs",
                   help="order of prompts at admission: first come first served, longest cached prefix first, or "
                        "shortest remaining prompt first (aged, so long prompts are not starved)")
    e.add_argument("--yield-step-tokens", type=int, default=None, metavar="N",
                   help="while requests of more than one priority or tenant arrive, the prompt tokens a step "
                        "gives the classes that rank after the first (none while one of the first's prompts can "
                        "run), so an urgent or owed request waits for one small step at most; 0: off "
                        "(default: by device, CPU 32, CUDA 512)")
    e.add_argument("--yield-window", type=float, default=None, metavar="S", dest="yield_window_s",
                   help="seconds a class counts as arriving after its last request (default 30)")
    e.add_argument("--no-prefix-cache", action="store_true")
    e.add_argument("--kv-tier-dir", metavar="PATH", default=None,
                   help="a directory for the KV tier below the pool: blocks the prefix cache evicts are kept "
                        "there and loaded back when a prompt's prefix reaches them (one directory per node)")
    e.add_argument("--kv-tier-size", type=int, default=None, metavar="MB", dest="kv_tier_size_mb",
                   help="the tier's size on disk (default 4096)")
    e.add_argument("--kv-host-tier-size", type=int, default=None, metavar="MB", dest="kv_host_tier_size_mb",
                   help="a host-memory KV tier between the pool and the disk tier, per node (pinned on a GPU; "
                        "default 0: none)")
    e.add_argument("--kv-tier-policy", choices=["write-back", "write-through-selective"], default=None,
                   help="when blocks go down to the tiers: when the prefix cache evicts them (write-back, the "
                        "default), or once matched --kv-tier-write-through-hits times (cold blocks are never written)")
    e.add_argument("--kv-tier-write-through-hits", type=int, default=None, metavar="N",
                   help="write-through-selective: matches before a block is written down (default 2)")
    e.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                   help="auto: float32 on CPU, bfloat16 on CUDA")
    e.add_argument("--device", default="auto")
    e.add_argument("--cpu-kernels", choices=["auto", "native", "torch"], default="auto",
                   help="CPU fast paths (C decode attention, prepacked oneDNN linears); torch = plain torch ops")
    e.add_argument("--attention-backend", choices=BACKEND_CHOICES, default="auto",
                   help="attention and layer kernels: triton reads KV blocks in place and fuses the norms, rotary and "
                        "SwiGLU (CUDA); flashinfer runs attention on FlashInfer's kernels instead (CUDA, bf16/fp16, "
                        "pip install flashinfer-python); torch is the reference path; auto = triton on CUDA when "
                        "Triton imports")
    e.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs for decode steps")
    e.add_argument("--disable-overlap-schedule", action="store_true",
                   help="no overlap scheduling: each step's host work waits for the previous step's GPU work")
    e.add_argument("--quantization", choices=["none", "int8", "int8-g32"], default="none",
                   help="weight-only int8 projections, activations in --dtype: int8 = a scale per output channel, "
                        "int8-g32 = a scale and offset per 32 weights (exact for a GGUF's Q4/Q8 groups)")
    return e


def engine_options(args: argparse.Namespace) -> dict:
    """EngineConfig options from the group's flags. Torch threads are not among them: a node actor
    takes its own from its Ray CPUs (--cpus-per-node)."""
    options = dict(block_size=args.block_size, schedule_policy=args.schedule_policy,
                   enable_prefix_cache=not args.no_prefix_cache, dtype=args.dtype, device=args.device,
                   cpu_kernels=args.cpu_kernels, quantization=args.quantization,
                   attention_backend=args.attention_backend, enforce_eager=args.enforce_eager,
                   disable_overlap_schedule=args.disable_overlap_schedule)
    # Unset: EngineConfig's default, or the device kind's for the batch sizes.
    for name in ("kv_tier_dir", "kv_tier_size_mb", "kv_host_tier_size_mb", "kv_tier_policy", "kv_tier_write_through_hits",
                 "num_blocks", "kv_cache_memory_mb", "gpu_memory_utilization", "chunked_prefill_size",
                 "max_num_batched_tokens", "max_running_requests", "max_waiting_requests", "yield_step_tokens",
                 "yield_window_s"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    return options
