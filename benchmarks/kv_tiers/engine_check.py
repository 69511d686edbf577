"""The KV tiers below the pool on one engine (engine/cache/kv_tiers.py), on a GPU or on this CPU:

1. equality: 8 random prompts of 1,024-1,920 tokens (x --scale), 32 greedy tokens each, twice (the
   second pass in reverse order), on an engine whose pool keeps everything and on one whose pool
   holds 1.5 prompts over a host tier of 64 MB and a disk tier. The second pass reloads its prefixes
   from the tiers; its tokens and cached counts are compared with the big pool's.
2. time to first token of one prompt of 3,968 tokens (the 4,096 context of random:llama-1b, less
   room for the token): recomputed, from the pool, from host memory, from disk.

    python -m raypd.benchmarks.kv_tiers.engine_check OUT.json [--model random:llama-1b] [--device cuda]
        [--scale 1.0] [--tokenizer DIR]
    (a CPU rehearsal: --model default --device cpu --scale 0.125)
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from raypd.benchmarks.random_models import resolve_bench_model
from raypd.engine import LLM, SamplingParams

NUM_PROMPTS = 8
GREEDY = SamplingParams(max_tokens=32, temperature=0.0)
ONE_TOKEN = SamplingParams(max_tokens=1, temperature=0.0)
VOCAB = 30000  # ids drawn below it: inside every vocabulary this runs with


def two_passes(llm: LLM, prompts: list[list[int]]) -> tuple[list, list, list]:
    """(first pass tokens, second pass tokens, second pass cached counts), per prompt."""
    first = [llm.generate([p], GREEDY)[0] for p in prompts]
    second = {i: llm.generate([prompts[i]], GREEDY)[0] for i in reversed(range(len(prompts)))}
    return ([o.token_ids for o in first], [second[i].token_ids for i in range(len(prompts))],
            [second[i].num_cached_tokens for i in range(len(prompts))])


def equality(model: str | None, device: str, prompts: list[list[int]], folder: Path, host_mb: int) -> dict:
    start = time.time()
    big = LLM(model, device=device, num_blocks=sum(len(p) for p in prompts) // 16 + 64 * NUM_PROMPTS)
    ref = two_passes(big, prompts)
    del big
    free_device_memory(device)
    small = LLM(model, device=device, num_blocks=int((len(prompts[-1]) // 16 + 4) * 1.5),
                kv_host_tier_size_mb=host_mb, kv_tier_dir=str(folder), kv_tier_size_mb=4096)
    got = two_passes(small, prompts)
    small.engine.check_block_integrity()
    out = {"prompts": len(prompts), "first_pass_equal": sum(a == b for a, b in zip(got[0], ref[0])),
           "second_pass_equal": sum(a == b for a, b in zip(got[1], ref[1])),
           "second_pass_equal_by_prompt": [a == b for a, b in zip(got[1], ref[1])],
           "cached_equal": sum(a == b for a, b in zip(got[2], ref[2])), "cached_tokens_second_pass": got[2],
           "pool_blocks": small.engine.num_blocks,
           "tier_stats": {k: v for k, v in small.engine.stats().items() if k.startswith("kv_tier")},
           "load_rates_bytes_per_s": dict(small.engine.load().tier_load_bytes_per_s),
           "kv_bytes_per_token": small.engine.kv_bytes_per_token, "seconds": round(time.time() - start, 1)}
    del small
    free_device_memory(device)
    return out


def ttft_by_tier(model: str | None, device: str, n: int, folder: Path, host_mb: int, seed: int = 1) -> dict:
    """Seconds to the first token of one n-token prompt: recomputed, from the pool, and after the
    pool evicted it (to host memory, or with no host tier to disk), twice."""
    g = torch.Generator().manual_seed(seed)
    prompt, warm = (torch.randint(100, VOCAB, (n,), generator=g).tolist() for _ in range(2))
    sync: Callable[[], None] = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out: dict = {"prompt_tokens": n}
    for tier, mb in (("host", host_mb), ("disk", 0)):
        llm = LLM(model, device=device, num_blocks=n // 16 + 64, kv_host_tier_size_mb=mb,
                  kv_tier_dir=str(folder / tier), kv_tier_size_mb=8192)
        llm.generate([warm], ONE_TOKEN)  # every kernel compiled and warm at this length
        cache = llm.engine.prefix_cache
        cache.evict(llm.engine.num_blocks)
        row: dict = {}
        for label in ("recomputed", "pool", f"from_{tier}", f"from_{tier}_again"):
            if label.startswith("from_"):
                cache.evict(llm.engine.num_blocks)  # everything down one tier
            sync()
            start = time.perf_counter()
            o = llm.generate([prompt], ONE_TOKEN)[0]
            sync()
            row[label] = {"s": round(time.perf_counter() - start, 4), "cached": o.num_cached_tokens}
        row["load_rates_bytes_per_s"] = dict(llm.engine.load().tier_load_bytes_per_s)
        llm.engine.check_block_integrity()
        out[tier] = row
        del llm
        free_device_memory(device)
    return out


def free_device_memory(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", default="random:llama-1b", help="random:NAME, a folder, or 'default' (the embedded model)")
    ap.add_argument("--tokenizer", type=Path, help="for random:NAME: the tokenizer files' folder (default: the embedded model's)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--scale", type=float, default=1.0, help="prompt lengths and tier sizes x this")
    args = ap.parse_args(argv)
    model = (str(resolve_bench_model(args.model, args.tokenizer)) if args.model.startswith("random:")
             else None if args.model == "default" else args.model)
    scaled = lambda n: max(32, int(n * args.scale))  # noqa: E731
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, VOCAB, (scaled(1024 + 128 * i),), generator=g).tolist() for i in range(NUM_PROMPTS)]
    folder = Path(tempfile.mkdtemp(prefix="raypd-tiers-"))
    result: dict = {"model": args.model, "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
    try:
        result["equality"] = equality(model, args.device, prompts, folder / "equality", max(1, int(64 * args.scale)))
        print(json.dumps(result["equality"], indent=1), flush=True)
        result["ttft"] = ttft_by_tier(model, args.device, scaled(3968), folder, max(1, int(4096 * args.scale)))
        print(json.dumps(result["ttft"], indent=1), flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        args.out.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
