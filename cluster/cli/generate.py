"""`raypd generate`: run prompts and print completions (text or JSON lines, in input order).

--mode single (default) runs one engine in this process; --mode pd starts (or joins, --address) a Ray
cluster with prefill and decode node actors and sends every prompt through them at once; --mode mixed
does the same with colocated nodes. The output is the same in every mode."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from raypd.cluster.cli.engine_args import add_engine_args, engine_options
from raypd.cluster.cli.transfer_args import add_transfer_args


def add_generate_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate completions for prompts (one engine, or PD / mixed node actors)")
    p.add_argument("prompts", nargs="*", help="prompt strings")
    p.add_argument("--input", type=Path, help='JSONL file: {"prompt": str} | {"prompt_token_ids": [int]} | {"messages": [...]}')
    p.add_argument("--model", help="Hugging Face model folder or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--json", action="store_true", help="print one JSON object per prompt, in input order")
    s = p.add_argument_group("sampling")
    s.add_argument("--max-tokens", type=int, default=64)
    s.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (the default)")
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--top-k", type=int, default=-1)
    s.add_argument("--min-p", type=float, default=0.0)
    s.add_argument("--seed", type=int, default=None)
    s.add_argument("--ignore-eos", action="store_true")
    c = p.add_argument_group("cluster (--mode pd | mixed)")
    c.add_argument("--mode", choices=["single", "pd", "mixed"], default="single")
    c.add_argument("--prefill-nodes", type=int, default=1)
    c.add_argument("--decode-nodes", type=int, default=1)
    c.add_argument("--mixed-nodes", type=int, default=1)
    c.add_argument("--address", help="join this Ray cluster instead of starting a local one")
    c.add_argument("--cpus-per-node", type=float, default=1.0, help="Ray CPUs per node actor (= torch threads)")
    c.add_argument("--gpus-per-node", type=float, default=None,
                   help="GPUs per node actor, at most 1 (no tensor parallelism); default: 1 where Ray reports GPUs, else 0")
    c.add_argument("--policy", default="cost",
                   help="the Conductor's routing policy (round_robin, least_loaded, cache_aware, cost); "
                        "none = no Conductor, the driver's round-robin")
    c.add_argument("--place-by-role", action="store_true",
                   help="put each node actor on a Ray node labelled raypd.io/role=<its role>")
    add_transfer_args(c)
    c.add_argument("--decode-num-blocks", type=int, default=None, help="KV blocks on decode nodes (default --num-blocks)")
    c.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for any one token")
    e = add_engine_args(p)
    e.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (--mode single; node actors take --cpus-per-node)")
    p.set_defaults(run=run_generate)


def read_prompts(args) -> list:
    prompts: list = list(args.prompts)
    if args.input is not None:
        try:
            lines = args.input.read_text().splitlines()
        except OSError as e:
            raise ValueError(f"cannot read {args.input}: {e.strerror}") from e
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{args.input}:{n}: not JSON ({e.msg})") from e
            if not isinstance(obj, dict) or not ({"prompt", "prompt_token_ids", "messages"} & obj.keys()):
                raise ValueError(f'{args.input}:{n}: expected {{"prompt"}}, {{"prompt_token_ids"}} or {{"messages"}}')
            prompts.append(obj)
    if not prompts:
        raise ValueError("no prompts: pass them as arguments or with --input FILE.jsonl")
    return prompts


def run_generate(args) -> int:
    from raypd.engine import EngineError, SamplingParams

    try:
        prompts = read_prompts(args)
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, min_p=args.min_p, seed=args.seed, ignore_eos=args.ignore_eos)
        if args.mode == "single":
            from raypd.engine import LLM  # torch: only the one-process mode runs the model here

            outputs = LLM(args.model, num_threads=args.threads, **engine_options(args)).generate(prompts, params)
        else:
            from raypd.cluster.cli.generate_cluster import generate_on_cluster  # imports Ray: only when needed
            outputs = generate_on_cluster(args, prompts, params)
    except (EngineError, ValueError, RuntimeError) as e:
        print(f"raypd generate: error: {e}", file=sys.stderr)
        return 2
    for out in outputs:
        if args.json:
            print(json.dumps({"token_ids": out.token_ids, "text": out.text, "finish_reason": out.finish_reason,
                              "num_cached_tokens": out.num_cached_tokens}))
        else:
            print(f"--- [{out.finish_reason}, {len(out.token_ids)} tokens, {out.num_cached_tokens} cached]")
            print(out.text)
    return 0
