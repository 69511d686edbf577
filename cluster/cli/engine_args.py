"""The engine's flags (the "engine" argument group of `raypd generate` and `raypd serve`) and the
EngineConfig options they give. Each default is EngineConfig's, so a flag left unset changes nothing."""
from __future__ import annotations

import argparse


def add_engine_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Add the group to `parser` and return it (a command may add flags of its own to it)."""
    e = parser.add_argument_group("engine")
    e.add_argument("--block-size", type=int, default=16)
    e.add_argument("--num-blocks", type=int, default=None, help="KV blocks per engine (default: from memory)")
    e.add_argument("--chunked-prefill-size", type=int, default=256, help="<= 0 disables chunking")
    e.add_argument("--max-num-batched-tokens", type=int, default=512)
    e.add_argument("--max-running-requests", type=int, default=64)
    e.add_argument("--max-waiting-requests", type=int, default=None,
                   help="per node: requests waiting to run beyond which it refuses new ones at once "
                        "(HTTP 429); default: --max-running-requests")
    e.add_argument("--schedule-policy", choices=["fcfs", "lpm"], default="fcfs")
    e.add_argument("--no-prefix-cache", action="store_true")
    e.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    e.add_argument("--device", default="auto")
    e.add_argument("--cpu-kernels", choices=["auto", "native", "torch"], default="auto",
                   help="CPU fast paths (C decode attention, prepacked oneDNN linears); torch = plain torch ops")
    return e


def engine_options(args: argparse.Namespace) -> dict:
    """EngineConfig options from the group's flags. Torch threads are not among them: a node actor
    takes its own from its Ray CPUs (--cpus-per-node)."""
    options = dict(block_size=args.block_size, chunked_prefill_size=args.chunked_prefill_size,
                   max_num_batched_tokens=args.max_num_batched_tokens, max_running_requests=args.max_running_requests,
                   schedule_policy=args.schedule_policy, enable_prefix_cache=not args.no_prefix_cache,
                   dtype=args.dtype, device=args.device, cpu_kernels=args.cpu_kernels)
    if args.num_blocks is not None:
        options["num_blocks"] = args.num_blocks
    if args.max_waiting_requests is not None:
        options["max_waiting_requests"] = args.max_waiting_requests
    return options
