"""A prefill node's memory under the soak's requests, in one process and without Ray: where the
soak's prefill-node RSS growth can be measured in minutes and put under a native heap profiler.

    python -m raypd.benchmarks.soak.heap_probe --requests 400 --warmup 100
    PYTHONMALLOC=malloc python -m raypd.benchmarks.soak.heap_probe --warmup 300 --memray /tmp/probe.bin

What it runs: one engine built as a node builds it (num_threads from --threads, like a 1-CPU node
actor), every request prefill_only and released once prefilled (prefill_node/: the prompt's blocks
stay in the prefix cache), on the soak's request list (benchmarks/chaos/workload.py, the chat ones
through the chat template). Arrivals are a seeded Poisson count per engine step (--arrivals), so
steps carry one prompt or several, as a lightly loaded prefill node's do.

What it reports, every --every requests: RSS and the bytes glibc's malloc holds in use (mallinfo2:
what is live, whatever fragmentation does to RSS); at the end, the slope of both per request over
the measured requests (after --warmup) and the prompt tokens/s of the measured phase.

--memray PATH tracks the measured phase only (memray.Tracker, native stacks): allocations made in
it and still alive at its end are what it retained. Read them with
    memray flamegraph --leaks PATH   /   memray tree PATH   /   memray stats PATH
(best with PYTHONMALLOC=malloc so Python objects show as ordinary allocations).
"""
from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import random
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from raypd.benchmarks.chaos.workload import build_requests

PAGE = 4096


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def malloc_in_use() -> int | None:
    """Bytes malloc has handed out and not had back (in arenas + mmapped chunks); None off glibc."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _Mallinfo2
    m = fn()
    return m.uordblks + m.hblkhd


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def prompts(num: int, seed: int, fixed_length: int | None, tokenizer, vocab: int) -> list[list[int]]:
    """The soak's prompts as token ids (or `fixed_length` ids each, cut from them: the one-shape control)."""
    out = []
    for r in build_requests(num, seed):
        if r.endpoint == "chat":
            ids = tokenizer.apply_chat_template([{"role": "user", "content": r.text}])
        else:
            ids = tokenizer.encode(r.text)
        out.append(ids)
    if fixed_length is not None:  # new ids each time (no prefix shared beyond chance), one length
        out = [((p * (1 + fixed_length // len(p)))[:fixed_length]) for p in out]
        out = [[(t + 7919 * i) % vocab for t in p] for i, p in enumerate(out)]
    return out


def run(args) -> dict:
    from raypd.engine.engine import LLMEngine
    from raypd.engine.tokenizer import Tokenizer
    from raypd.protocol.sampling_params import SamplingParams

    options = json.loads(args.engine_options)
    options.setdefault("num_threads", args.threads)
    engine = LLMEngine(args.model, **options)
    ids = prompts(args.warmup + args.requests, args.seed, args.fixed_length, Tokenizer(engine.model_dir),
                  engine.model_config.vocab_size)
    params = SamplingParams(max_tokens=32, temperature=0.0)
    rng = random.Random(args.seed)
    samples: list[dict] = []
    done = added = 0
    tokens = 0
    t0 = 0.0
    tracking = ExitStack()
    while done < len(ids):
        if done >= args.warmup and not samples:  # the measured phase starts
            if args.memray:  # an optional tool (pip install memray), not a dependency of raypd
                memray = importlib.import_module("memray")
                Path(args.memray).unlink(missing_ok=True)
                tracking.enter_context(memray.Tracker(args.memray, native_traces=True))
            t0 = time.perf_counter()
            samples.append({"requests": 0, "rss": rss_bytes(), "malloc": malloc_in_use(), "t": 0.0})
        k = _poisson(rng, args.arrivals) if engine.has_unfinished() else max(1, _poisson(rng, args.arrivals))
        for _ in range(min(k, len(ids) - added)):
            engine.add_request(ids[added], params, f"p{added}", prefill_only=True)
            added += 1
        for out in engine.step():
            engine.release(out.request_id)
            if done >= args.warmup:
                tokens += len(ids[int(out.request_id[1:])])
            done += 1
            n = done - args.warmup
            if n > 0 and n % args.every == 0:
                samples.append({"requests": n, "rss": rss_bytes(), "malloc": malloc_in_use(),
                                "t": time.perf_counter() - t0})
                if not args.quiet:
                    s = samples[-1]
                    print(f"{n:6d} requests  rss {s['rss'] / 2**20:8.1f} MiB  malloc in use "
                          f"{(s['malloc'] or 0) / 2**20:8.1f} MiB  {s['t']:6.1f}s", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - t0
    tracking.close()
    xs = [s["requests"] for s in samples]
    report = {"requests": args.requests, "warmup": args.warmup, "fixed_length": args.fixed_length,
              "engine_options": options, "samples": samples,
              "rss_bytes_per_request": slope(xs, [s["rss"] for s in samples]),
              "malloc_bytes_per_request": slope(xs, [s["malloc"] or 0 for s in samples]),
              "rss_growth_bytes": samples[-1]["rss"] - samples[0]["rss"],
              "prompt_tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0}
    return report


def _poisson(rng: random.Random, mean: float) -> int:
    """Knuth's: the count of arrivals in one step."""
    limit, k, p = pow(2.718281828459045, -mean), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m raypd.benchmarks.soak.heap_probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=400, help="measured requests (after the warm-up)")
    p.add_argument("--warmup", type=int, default=100, help="requests before the measured phase")
    p.add_argument("--every", type=int, default=25, help="requests between samples")
    p.add_argument("--arrivals", type=float, default=1.0, help="mean new requests per engine step (Poisson)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (a node gets its CPUs' count)")
    p.add_argument("--fixed-length", type=int, help="every prompt this many tokens (the one-shape control)")
    p.add_argument("--model", help="model path (default: the packaged SmolLM2-135M)")
    p.add_argument("--engine-options", default="{}", help="JSON of more LLMEngine options")
    p.add_argument("--memray", help="track the measured phase with memray (native stacks) into this file")
    p.add_argument("--json", type=Path, help="write the report here")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.requests < 2 * args.every or args.warmup < 0:
        print("heap_probe: need --requests >= 2 x --every and --warmup >= 0", file=sys.stderr)
        return 2
    report = run(args)
    print(f"rss {report['rss_bytes_per_request'] / 1024:.1f} KiB/request, malloc in use "
          f"{report['malloc_bytes_per_request'] / 1024:.1f} KiB/request, rss growth "
          f"{report['rss_growth_bytes'] / 2**20:.1f} MiB over {args.requests} requests, "
          f"{report['prompt_tokens_per_s']:.0f} prompt tokens/s")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
