"""`raypd bench parity`: raypd's greedy tokens against transformers, on tiny random checkpoints of
every family raypd loads (Llama, Qwen2 with q/k/v biases, Qwen3 with q/k norms, Llama-3 rope
scaling; benchmarks/random_models.py), on the device of your choice. Nothing is downloaded.

Per family, with the attention backend the engine picks (on CUDA: the Triton kernels, with decode
steps replayed from CUDA graphs unless --enforce-eager):
- float32: transformers' greedy tokens (TF32 off) are the reference; raypd's must equal them for
  every prompt, cold and again from the prefix cache (chunked prefill after a cached prefix);
- bfloat16 (CUDA only): raypd's agreement with that reference beside transformers' own in bf16
  (the share of tokens before each prompt's first difference). bf16 flips near-ties either way, so
  raypd should be about as close as transformers is.

FlashInfer (--attention-backend flashinfer) has no float32 kernels and compiles head_dim 64, 128 and
256 only: its run compares bf16 alone, on checkpoints with --head-dim 64 (or wider).

Exit status 0 when every float32 comparison is identical (with flashinfer: when raypd's bf16 share
is at least transformers' bf16 share for every family).

    raypd bench parity --device cuda --json parity.json
    raypd bench parity --device cpu --attention-backend triton   (Triton's interpreter: TRITON_INTERPRET=1)
    raypd bench parity --device cuda --attention-backend flashinfer --head-dim 64
    raypd bench parity --device cuda --random-prompts 64    (bf16 shares over 64 seeded random prompts)
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raypd.benchmarks.random_models import TINY_FAMILIES, copy_tokenizer, tiny_family
from raypd.benchmarks.workloads import greedy_agreement
from raypd.engine import LLM, SamplingParams
from raypd.engine.config import BACKEND_CHOICES
from raypd.engine.device import resolve_device
from raypd.engine.model.source import resolve_model

PROMPTS = [list(range(10, 15)), list(range(300, 400)), list(range(300, 380)) + [7, 7, 7]]


def random_prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """n prompts of 4-200 random tokens (ids 3 and up: no special token): a larger sample for the
    bf16 shares, whose three fixed prompts flip by near-ties either way."""
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, size=int(rng.integers(4, 201))).tolist() for _ in range(n)]


def hf_greedy(model: Any, device: torch.device, dtype: torch.dtype, max_tokens: int,
              prompts: list[list[int]] = PROMPTS) -> list[list[int]]:
    if device.type == "cuda" and dtype == torch.float32:
        # The reference in IEEE float32 every time: a bf16 engine built earlier in this process (the
        # previous family's) turned TF32 on process-wide for its leftover float32 matmuls
        # (engine/device.py configure_math).
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    model = model.to(device=device, dtype=dtype)
    with torch.inference_mode():
        return [model.generate(torch.tensor([ids], device=device), attention_mask=torch.ones(1, len(ids), dtype=torch.long,
                                                                                             device=device),
                               max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False)[0, len(ids):].tolist()
                for ids in prompts]


def raypd_greedy(folder: Path, device: torch.device, dtype: str, max_tokens: int, args,
                 prompts: list[list[int]]) -> tuple[list[list[int]], ...]:
    llm = LLM(str(folder), device=str(device), dtype=dtype, attention_backend=args.attention_backend,
              enforce_eager=args.enforce_eager, block_size=8, chunked_prefill_size=16, kv_cache_memory_mb=64,
              max_running_requests=8)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    cold = [o.token_ids for o in llm.generate(prompts, params)]
    warm = [o.token_ids for o in llm.generate(prompts, params)]
    llm.engine.check_block_integrity()
    return cold, warm


def check_family(name: str, device: torch.device, tokenizer: Path, args) -> dict[str, Any]:
    ref_model = tiny_family(name, head_dim=args.head_dim)
    with tempfile.TemporaryDirectory(prefix=f"raypd-parity-{name}-") as tmp:
        folder = Path(tmp)
        ref_model.save_pretrained(folder)
        copy_tokenizer(tokenizer, folder)
        prompts = random_prompts(args.random_prompts, ref_model.config.vocab_size) if args.random_prompts else PROMPTS
        reference = hf_greedy(ref_model, device, torch.float32, args.max_tokens, prompts)
        out: dict[str, Any] = {"prompts": len(prompts), "float32_identical": None, "float32_prompts_identical": None}
        if args.attention_backend != "flashinfer":
            cold, warm = raypd_greedy(folder, device, "float32", args.max_tokens, args, prompts)
            out.update(float32_identical=cold == reference and warm == reference,
                       float32_prompts_identical=sum(a == b for a, b in zip(cold, reference)))
        if device.type == "cuda" and not args.skip_bf16:
            bf16, _ = raypd_greedy(folder, device, "bfloat16", args.max_tokens, args, prompts)
            hf_bf16 = hf_greedy(ref_model, device, torch.bfloat16, args.max_tokens, prompts)
            out["bf16_token_share"] = {"raypd": greedy_agreement(bf16, reference)[0],
                                       "transformers": greedy_agreement(hf_bf16, reference)[0]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--families", type=lambda s: s.split(","), default=list(TINY_FAMILIES))
    ap.add_argument("--tokenizer", type=Path, help="a folder with the default model's tokenizer files (default: the "
                    "embedded model's)")
    ap.add_argument("--attention-backend", choices=BACKEND_CHOICES, default="auto")
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--random-prompts", type=int, default=0, metavar="N",
                    help="N seeded random prompts of 4-200 tokens instead of the 3 fixed ones (a larger bf16 sample)")
    ap.add_argument("--head-dim", type=int, help="the checkpoints' head_dim (default: hidden/heads = 16; qwen3 32)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--skip-bf16", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    if device.type == "cuda":  # the float32 reference: no TF32 in transformers either
        torch.backends.cuda.matmul.allow_tf32 = False
    tokenizer = args.tokenizer or resolve_model(None)
    results = {name: check_family(name, device, tokenizer, args) for name in args.families}
    for name, r in results.items():
        line = f"{name:<7} float32 " + ("not run (no float32 kernels)" if r["float32_identical"] is None else
                                        f"{'identical' if r['float32_identical'] else 'DIFFERS'} "
                                        f"({r['float32_prompts_identical']}/{r['prompts']} prompts cold)")
        if "bf16_token_share" in r:
            b = r["bf16_token_share"]
            line += f"; bf16 tokens before the first difference: raypd {b['raypd']:.1%}, transformers {b['transformers']:.1%}"
        print(line, flush=True)
    if args.attention_backend == "flashinfer":
        passed = all("bf16_token_share" in r and r["bf16_token_share"]["raypd"] >= r["bf16_token_share"]["transformers"]
                     for r in results.values())
    else:
        passed = all(r["float32_identical"] for r in results.values())
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"device": str(device), "results": results, "passed": passed}, indent=2))
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
