"""raypd's node engine vs Hugging Face transformers and llama.cpp's server: output throughput and latency
on one machine, in one run.

Every system runs the same seeded no-reuse workload (benchmarks/workloads.py), greedy, every request
producing exactly max_tokens; a level of concurrency C runs max(--num-requests, 2 C) of them.
transformers runs the same Hugging Face folder as raypd, on raypd's device in raypd's dtype (float32
on a CPU); llama.cpp runs the GGUF they come from (benchmarks/engine_llamacpp.py); raypd runs them in
--dtype with --quantization. --model takes a folder, a .gguf, or random:NAME (benchmarks/
random_models.py: a random-weight checkpoint in a real model's shapes, built in place).
- raypd: closed loop, C requests in flight; a finished request is replaced by the next one. Each token
  is timestamped when step() returns it; a request's clock starts when it is added.
- transformers: static batches of C requests, left-padded, model.generate(max_new_tokens = the batch's
  largest max_tokens). A StoppingCriteria timestamps every generation step; a request's tokens are its
  first max_tokens outputs and its clock starts when its batch starts. Throughput counts only those
  tokens, over the summed wall time of the batches.
- llama.cpp: closed loop over HTTP, C client threads, one llama-server with C slots per level.
Each raypd measurement uses a fresh engine, so the prefix cache holds nothing from earlier runs.
On CUDA every step is timed (engine/gpu/step_timer.py): per decode step, its CPU time (wall time less
the wait for the GPU) and the GPU's busy time (CUDA events), for graph replays and eager steps apart
(with overlap scheduling, on by default, a call's wait is for the step before, which ran meanwhile);
the kernels one decode step launches are counted (torch.profiler, at the highest concurrency).
Each level also reports its slowest steps, the garbage collector's pauses and every Triton kernel
compiled during the measured run (engine/gc_pauses.py, engine/gpu/triton_compiles.py): outliers
with their causes. Each engine's start-up heap is frozen before it is measured, as a node actor's is.
--fp32-agreement also runs raypd in float32 without quantization at the highest concurrency and
states how far every other system's greedy tokens agree with it (the reference the parity tests
hold to transformers): the share of tokens before each request's first difference, and the share
of requests identical throughout.

    python benchmarks/engine_throughput.py --concurrency 1,8,32 --json bench-results/engine_throughput.json
    raypd bench engine --systems raypd,llamacpp --quantization int8-g32 --concurrency 1,32 --fp32-agreement
    raypd bench engine --device cuda --model random:llama-1b --concurrency 1,64,256 \
        --prompt-len-range 256,256 --max-tokens-range 128,128 --hf-max-batches 2
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raypd.benchmarks.engine_llamacpp import LlamaCppPeer
from raypd.benchmarks.random_models import resolve_bench_model
from raypd.benchmarks.workloads import BenchRequest, greedy_agreement, no_reuse_workload
from raypd.engine import LLMEngine, SamplingParams
from raypd.engine.config import BACKEND_CHOICES
from raypd.engine.device import resolve_device, resolve_dtype
from raypd.engine.gc_pauses import GcPauses, freeze_heap, thaw_heap
from raypd.engine.gpu.cuda_graphs import DecodeInputs
from raypd.engine.gpu.runner import CudaModelRunner
from raypd.engine.gpu.step_timer import StepTimer
from raypd.engine.gpu.triton_compiles import TritonCompiles
from raypd.engine.model.quantization import QUANTIZATIONS
from raypd.engine.tokenizer import Tokenizer

WARMUP_TEXT = "Warm up: say hello."


# -- metrics --------------------------------------------------------------------------------------
def summarize(recs: list[dict], wall: float) -> dict:
    """recs: one {"sent", "times"} per request (times = one timestamp per output token)."""
    ttft = [r["times"][0] - r["sent"] for r in recs]
    tpot = [(r["times"][-1] - r["times"][0]) / (len(r["times"]) - 1) for r in recs if len(r["times"]) > 1]
    itl = [b - a for r in recs for a, b in zip(r["times"], r["times"][1:])]
    e2e = [r["times"][-1] - r["sent"] for r in recs]
    out_tokens = sum(len(r["times"]) for r in recs)
    s = {"num_requests": len(recs), "output_tokens": out_tokens, "wall_s": wall,
         "output_tok_s": out_tokens / wall, "req_s": len(recs) / wall}
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e", e2e)):
        s[f"{name}_mean_s"] = float(np.mean(xs)) if xs else float("nan")
        for q in (50, 90, 99):
            s[f"{name}_p{q}_s"] = float(np.percentile(xs, q)) if xs else float("nan")
    return s


def median_summary(reps: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in reps) if isinstance(reps[0][k], (int, float)) else reps[0][k]
            for k in reps[0]}


# -- raypd ----------------------------------------------------------------------------------------
def make_engine(args) -> LLMEngine:
    # Batch sizes left unset take the device kind's defaults (engine/device.py).
    batch = {k: getattr(args, k) for k in ("max_num_batched_tokens", "chunked_prefill_size") if getattr(args, k) is not None}
    eng = LLMEngine(str(args.model_dir), max_running_requests=max(64, max(args.concurrency)), num_threads=args.threads,
                    dtype=args.dtype, cpu_kernels=args.cpu_kernels, quantization=args.quantization, device=args.device,
                    attention_backend=args.attention_backend, enforce_eager=args.enforce_eager,
                    disable_overlap_schedule=args.disable_overlap_schedule, **batch)
    if eng.device.type == "cuda" and isinstance(eng.runner, CudaModelRunner):
        eng.runner.timer = StepTimer()
    return eng


def step_times(eng: LLMEngine, walls: list[float]) -> dict[str, Any]:
    """Per kind of step: count, and median CPU and GPU-busy milliseconds (engine/gpu/step_timer.py)."""
    timer = getattr(eng.runner, "timer", None)
    if timer is None or len(timer.steps) != len(walls):
        return {}
    torch.cuda.synchronize()  # the GPU times read events: the last step's must have completed
    out: dict[str, Any] = {}
    for kind in sorted({t.kind for t in timer.steps}):
        rows = [(w - t.wait_s, t.gpu_s) for t, w in zip(timer.steps, walls) if t.kind == kind]
        out[kind] = {"steps": len(rows), "cpu_ms_p50": 1e3 * statistics.median(c for c, _ in rows),
                     "gpu_ms_p50": 1e3 * statistics.median(g for _, g in rows)}
    return out


def slowest_steps(eng: LLMEngine, walls: list[float], n: int = 5) -> list[dict[str, Any]]:
    """The n longest steps by wall time, with their kind and GPU time where the runner timed them."""
    timer = getattr(eng.runner, "timer", None)
    timed = timer.steps if timer is not None and len(timer.steps) == len(walls) else None
    order = sorted(range(len(walls)), key=lambda i: walls[i], reverse=True)[:n]
    return [{"step": i, "wall_ms": 1e3 * walls[i],
             **({"kind": timed[i].kind, "gpu_ms": 1e3 * timed[i].gpu_s} if timed is not None else {})} for i in order]


def kernels_per_decode_step(eng: LLMEngine, rows: int) -> dict[str, Any]:
    """The CUDA kernels one eager decode forward of `rows` sequences launches (torch.profiler): what a
    graph replay launches as one. Padding rows (slot -1, no context) launch what real ones do."""
    runner = eng.runner
    if eng.device.type != "cuda" or not isinstance(runner, CudaModelRunner):
        return {}
    from collections import Counter

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    dev = eng.device
    inputs = DecodeInputs(torch.zeros(rows, dtype=torch.int64, device=dev), torch.zeros(rows, dtype=torch.int64, device=dev),
                          torch.full((rows,), -1, dtype=torch.int64, device=dev), torch.zeros(rows, dtype=torch.int32, device=dev),
                          torch.zeros((rows, 16), dtype=torch.int32, device=dev))
    with torch.inference_mode():
        runner.decode_forward(inputs)
        torch.cuda.synchronize(dev)
        try:
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                runner.decode_forward(inputs)
                torch.cuda.synchronize(dev)
        except Exception as e:  # noqa: BLE001  (a profiler that cannot start here is a note, not a failure)
            return {"error": repr(e)}
    names = Counter(e.name for e in prof.events() if e.device_type == DeviceType.CUDA)
    total = sum(names.values())
    layers = eng.model_config.num_layers
    return {"rows": rows, "kernels": total, "per_layer": total / layers, "layers": layers,
            "by_kernel": dict(names.most_common(12))}


def run_raypd(eng: LLMEngine, work: list[BenchRequest], conc: int,
              walls: list[float] | None = None) -> tuple[list[dict], float]:
    """walls: each step's wall time is appended there when given."""
    recs: dict[str, dict[str, Any]] = {r.request_id: {"sent": 0.0, "times": [], "tokens": [], "cached": 0}
                                       for r in work}
    pending = iter(work)

    def submit() -> None:
        r = next(pending, None)
        if r is not None:
            recs[r.request_id]["sent"] = time.perf_counter()
            eng.add_request(r.prompt_token_ids, SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True),
                            request_id=r.request_id)

    start = time.perf_counter()
    for _ in range(conc):
        submit()
    timer = getattr(eng.runner, "timer", None)
    while eng.has_unfinished():
        t0 = time.perf_counter()
        outs = eng.step()
        now = time.perf_counter()
        if timer is not None:
            timer.close_call()
        if walls is not None:
            walls.append(now - t0)
        for o in outs:
            rec = recs[o.request_id]
            rec["times"] += [now] * len(o.new_token_ids)
            rec["tokens"] += o.new_token_ids
            rec["cached"] = o.num_cached_tokens
            if o.finished:
                submit()
    wall = time.perf_counter() - start
    for r in work:
        assert len(recs[r.request_id]["tokens"]) == r.max_tokens, f"raypd: {r.request_id} is short"
    return [recs[r.request_id] for r in work], wall


def warm_raypd(eng: LLMEngine) -> None:
    run_raypd(eng, [BenchRequest("warmup", Tokenizer(eng.model_dir).encode(WARMUP_TEXT), 8)], 1)
    timer = getattr(eng.runner, "timer", None)
    if timer is not None:
        timer.steps.clear()


def fresh_engine(args) -> LLMEngine:
    thaw_heap()  # the last engine's frozen objects (and any of its cycles) go now
    eng = make_engine(args)
    warm_raypd(eng)
    freeze_heap()
    return eng


def fp32_agreement(args, work: list[BenchRequest], tokens: dict[str, list[list[int]]]) -> dict[str, tuple[float, float]]:
    """Each system's greedy agreement with raypd in float32 without quantization, at the highest concurrency."""
    if args.dtype == "float32" and args.quantization == "none" and "raypd" in tokens:
        reference = tokens["raypd"]
    else:
        eng = fresh_engine(argparse.Namespace(**{**vars(args), "dtype": "float32", "quantization": "none"}))
        recs, _ = run_raypd(eng, work, max(args.concurrency))
        del eng
        reference = [r["tokens"] for r in recs]
    # A system that ran fewer requests (--hf-max-batches) is compared on the ones it ran.
    return {name: greedy_agreement(toks, reference[:len(toks)]) for name, toks in tokens.items()}


# -- transformers ---------------------------------------------------------------------------------
def load_hf(model_dir: Path, device: torch.device, dtype: torch.dtype) -> tuple[Any, Any]:
    """(model, tokenizer) from transformers, on raypd's device in raypd's dtype."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    model = model.to(device).eval()
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    tok.padding_side, tok.pad_token = "left", tok.eos_token
    # ignore_eos: with no eos id generate never stops early and every row runs max_new_tokens steps.
    # (Set on the model's own config: generate fills None values of a passed config from it.)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def run_hf(model, tok, work: list[BenchRequest], conc: int, max_batches: int | None = None) -> tuple[list[dict], float]:
    """max_batches: run only the first so many batches of conc requests (transformers is slow at C=1
    on a GPU; its throughput is tokens over the time of the batches it ran)."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class StepClock(StoppingCriteria):  # called once per generated token, right after it is appended
        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids, scores, **kwargs):
            self.times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    recs, wall = [], 0.0
    for b in range(0, len(work) if max_batches is None else min(len(work), max_batches * conc), conc):
        batch = work[b:b + conc]
        steps = max(r.max_tokens for r in batch)
        t0 = time.perf_counter()
        enc = tok.pad({"input_ids": [r.prompt_token_ids for r in batch]}, padding=True, return_tensors="pt").to(model.device)
        clock = StepClock()
        with torch.inference_mode():
            out = model.generate(**enc, do_sample=False, max_new_tokens=steps,
                                 stopping_criteria=StoppingCriteriaList([clock]))
        wall += time.perf_counter() - t0
        new = out[:, enc["input_ids"].shape[1]:]
        assert new.shape[1] == steps and len(clock.times) == steps, "transformers stopped early"
        for i, r in enumerate(batch):
            recs.append({"sent": t0, "times": clock.times[:r.max_tokens], "tokens": new[i, :r.max_tokens].tolist()})
    return recs, wall


# -- profile --------------------------------------------------------------------------------------
PROFILE_TARGETS = {  # name -> (file suffix, function name)
    "step": ("engine/engine.py", "step"),
    "schedule": ("engine/scheduler.py", "schedule"),
    "scheduler_update": ("engine/scheduler.py", "update"),
    "runner_run": ("engine/model_runner.py", "run"),
    "gpu_runner_run": ("engine/gpu/runner.py", "run"),
    "gpu_eager": ("engine/gpu/runner.py", "_eager"),
    "gpu_launch_ahead": ("engine/gpu/runner.py", "launch_ahead"),
    "gpu_collect": ("engine/gpu/runner.py", "collect"),
    "graph_replay": ("engine/gpu/cuda_graphs.py", "run"),
    "forward": ("engine/model/llama.py", "forward"),
    "paged_attention": ("engine/model/attention.py", "paged_attention"),
    "decode_kernel": ("engine/model/native_attention.py", "__call__"),
    "linear": ("engine/model/linear.py", "__call__"),
    "sample": ("engine/sampler.py", "sample"),
}


def profile_raypd(args, work: list[BenchRequest], conc: int, dump: Path) -> dict:
    eng = fresh_engine(args)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    run_raypd(eng, work, conc)
    prof.disable()
    wall = time.perf_counter() - t0
    del eng
    dump.parent.mkdir(parents=True, exist_ok=True)
    prof.dump_stats(dump)  # raw profile: python -m pstats PATH, or snakeviz PATH
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]  # set by Stats(), missing from typeshed
    cum = {k: sum(v[3] for (f, _, n), v in stats.items() if f.replace(os.sep, "/").endswith(sfx) and n == fn)
           for k, (sfx, fn) in PROFILE_TARGETS.items()}
    # The CPU runner's or the CUDA runner's steps, plain and overlapped (launched ahead, collected).
    run = cum["runner_run"] + cum["gpu_runner_run"] + cum["gpu_launch_ahead"] + cum["gpu_collect"]
    parts = {
        "model_forward": cum["forward"],
        "  of which projections (linear.py, incl. LM head)": cum["linear"],
        "  of which paged_attention": cum["paged_attention"],
        "    of which the native decode kernel": cum["decode_kernel"],
        "sampler_sample": cum["sample"],
        "graph_replay (CUDA: rows copied in, graph launched)": cum["graph_replay"],
        "tensor_building (runner.run - forward - replay - sample)": run - cum["forward"] - cum["graph_replay"] - cum["sample"],
        "scheduler_schedule": cum["schedule"],
        "scheduler_update": cum["scheduler_update"],
        "rest_of_step": cum["step"] - run - cum["schedule"] - cum["scheduler_update"],
        "outside_step (benchmark loop)": wall - cum["step"],
    }
    top = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:12]
    return {"concurrency": conc, "wall_s": wall, "cumulative_s": cum,
            "breakdown_s": parts, "breakdown_pct": {k: 100 * v / wall for k, v in parts.items()},
            "top_tottime": [{"function": f"{Path(f).name}:{line}:{n}", "tottime_s": v[2], "calls": v[1]}
                            for (f, line, n), v in top]}


# -- reporting ------------------------------------------------------------------------------------
def machine_info() -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    import transformers
    return {"cpu_model": cpu, "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "torch_threads": torch.get_num_threads(), "loadavg": os.getloadavg(), "platform": platform.platform()}


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:7.1f}ms"


def print_table(results: dict, concs: list[int]) -> None:
    head = (f"{'C':>3} {'system':<7} {'out tok/s':>9} {'req/s':>6} {'TTFT mean':>9} {'TTFT p99':>9} "
            f"{'TPOT mean':>9} {'TPOT p99':>9} {'E2E p50':>8} {'E2E p90':>8} {'E2E p99':>8}  raypd/peer")
    print(head + "\n" + "-" * len(head))
    for c in concs:
        for name in results:
            s = results[name].get(str(c))
            if s is None:
                continue
            ratio = "".join(f"  {s[k]:.2f}x vs {k.removeprefix('ratio_vs_')}" for k in s if k.startswith("ratio_vs_"))
            print(f"{c:>3} {name:<8} {s['output_tok_s']:9.1f} {s['req_s']:6.2f} {_ms(s['ttft_mean_s']):>9} "
                  f"{_ms(s['ttft_p99_s']):>9} {_ms(s['tpot_mean_s']):>9} {_ms(s['tpot_p99_s']):>9} "
                  f"{s['e2e_p50_s']:7.2f}s {s['e2e_p90_s']:7.2f}s "
                  f"{s['e2e_p99_s']:7.2f}s{ratio}")


def print_profile(p: dict) -> None:
    print(f"\nraypd profile (cProfile, C={p['concurrency']}, {p['wall_s']:.1f}s wall incl. profiler overhead):")
    for k, v in p["breakdown_s"].items():
        print(f"  {k:<48} {v:8.2f}s {p['breakdown_pct'][k]:5.1f}%")
    print("  top self time:")
    for t in p["top_tottime"][:8]:
        print(f"    {t['function']:<60} {t['tottime_s']:8.2f}s  {t['calls']} calls")


def int_pair(s: str) -> tuple[int, int]:
    a, b = (int(x) for x in s.split(","))
    return a, b


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    ap.add_argument("--systems", type=lambda s: s.split(","), default=["raypd", "hf"],
                    help="any of raypd, hf (transformers) and llamacpp (llama.cpp's llama-server), comma-separated")
    ap.add_argument("--max-tokens-range", type=int_pair, default=(16, 256))
    ap.add_argument("--prompt-len-range", type=int_pair, default=(20, 400))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                    help="raypd's and transformers' dtype (auto: float32 on a CPU, bfloat16 on CUDA)")
    ap.add_argument("--model", help="a Hugging Face folder, a .gguf, or random:NAME (benchmarks/random_models.py: "
                    "llama-1b, qwen3-0.6b); default: the embedded SmolLM2-135M-Instruct")
    ap.add_argument("--tokenizer", type=Path, help="the tokenizer folder a random:NAME model copies (default: the "
                    "embedded model's)")
    ap.add_argument("--attention-backend", choices=BACKEND_CHOICES, default="auto")
    ap.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    ap.add_argument("--disable-overlap-schedule", action="store_true",
                    help="no overlap scheduling (engine/overlap.py): each step waits for its own GPU work")
    ap.add_argument("--hf-max-batches", type=int, help="transformers runs at most this many batches per level")
    ap.add_argument("--quantization", choices=list(QUANTIZATIONS), default="none",
                    help="raypd's weight format (EngineConfig.quantization); int8-g32 holds a GGUF's Q4/Q8 groups exactly")
    ap.add_argument("--device", default="auto", help="raypd's and transformers' device (auto, cpu, cuda, cuda:N)")
    ap.add_argument("--fp32-agreement", action="store_true",
                    help="also run raypd in float32 unquantized and report each system's greedy agreement with it")
    ap.add_argument("--llamacpp-server", type=Path, help="llama-server binary (default: a cached build, else build one)")
    ap.add_argument("--cpu-kernels", choices=["auto", "native", "torch"], default="auto",
                    help="raypd's CPU fast paths; torch measures the plain-torch path")
    ap.add_argument("--repeats", type=int, default=1, help="runs per system and level; the report quotes medians")
    ap.add_argument("--max-num-batched-tokens", type=int, help="default: the device kind's (engine/device.py)")
    ap.add_argument("--chunked-prefill-size", type=int, help="default: the device kind's")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--profile", type=Path, help="also run raypd once at the highest concurrency under cProfile; "
                    "writes the raw profile to PATH, the summary to stdout and --json")
    args = ap.parse_args(argv)
    if unknown := set(args.systems) - {"raypd", "hf", "llamacpp"}:
        ap.error(f"unknown systems {sorted(unknown)}")
    torch.set_num_threads(args.threads)

    model_dir = args.model_dir = resolve_bench_model(args.model, args.tokenizer)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    work_all = no_reuse_workload(Tokenizer(model_dir).encode, max(args.num_requests, 2 * max(args.concurrency)),
                                 args.prompt_len_range, args.max_tokens_range, args.seed)
    info = machine_info()
    print(f"{info['cpu_model']}, {info['cpu_count']} cores, torch {info['torch']} ({args.threads} threads), "
          f"transformers {info['transformers']}; max({args.num_requests}, 2 C) requests per level, prompts {args.prompt_len_range}, "
          f"max_tokens {args.max_tokens_range}, seed {args.seed}, raypd dtype {args.dtype} "
          f"quantization {args.quantization} device {args.device}; "
          f"load average {info['loadavg'][0]:.2f} at start")

    hf: tuple[Any, Any] | None = None
    if "hf" in args.systems:
        hf = load_hf(model_dir, device, dtype)
        run_hf(*hf, [BenchRequest("warmup", hf[1].encode(WARMUP_TEXT), 8)], 1)
    llamacpp = None
    if "llamacpp" in args.systems:
        llamacpp = LlamaCppPeer(args.threads, args.llamacpp_server, None,
                                args.prompt_len_range[1] + args.max_tokens_range[1] + 64)
        info["llamacpp"] = f"{llamacpp.server}: {llamacpp.version()}"
        print(f"llama.cpp: {info['llamacpp']}, -t {args.threads}, --parallel = C, cache_prompt off")
    reps: dict[str, dict[str, list[dict]]] = {s: {} for s in args.systems}
    match: dict[str, float] = {}
    tokens: dict[str, list[list[int]]] = {}  # each system's greedy tokens at the highest concurrency
    work = work_all
    for c in args.concurrency:
        work = work_all[:max(args.num_requests, 2 * c)]
        for rep in range(args.repeats):
            outs = {}
            if "raypd" in args.systems:
                eng = fresh_engine(args)
                walls: list[float] = []
                with GcPauses() as pauses, TritonCompiles() as compiles:
                    recs, wall = run_raypd(eng, work, c, walls)
                s = summarize(recs, wall)
                s["cached_prompt_tokens"] = sum(r["cached"] for r in recs)
                s["step_times"] = step_times(eng, walls)
                s["slowest_steps"] = slowest_steps(eng, walls)
                s["gc"] = pauses.summary()
                s["triton_compiles"] = compiles.summary()
                if c == max(args.concurrency) and rep == 0:
                    kernels = kernels_per_decode_step(eng, min(c, eng.config.max_running_requests))
                    if kernels:
                        info["kernels_per_decode_step"] = kernels
                del eng
                reps["raypd"].setdefault(str(c), []).append(s)
                outs["raypd"] = recs
            if hf is not None:
                recs, wall = run_hf(*hf, work, c, args.hf_max_batches)
                reps["hf"].setdefault(str(c), []).append(summarize(recs, wall))
                outs["hf"] = recs
            if llamacpp is not None:
                recs, wall = llamacpp.run(work, c)
                reps["llamacpp"].setdefault(str(c), []).append(summarize(recs, wall))
                outs["llamacpp"] = recs
            if c == max(args.concurrency) and rep == 0:
                tokens |= {n: [r["tokens"] for r in recs] for n, recs in outs.items()}
            if "raypd" in outs and "hf" in outs and rep == 0:  # same greedy tokens? (padding/batching may flip near-ties)
                same = [a["tokens"] == b["tokens"] for a, b in zip(outs["raypd"], outs["hf"])]
                match[str(c)] = sum(same) / len(same)
            print(f"  C={c} run {rep + 1}/{args.repeats}: " + ", ".join(
                f"{n} {reps[n][str(c)][-1]['output_tok_s']:.1f} tok/s" for n in outs), flush=True)
            for kind, t in reps["raypd"][str(c)][-1].get("step_times", {}).items() if "raypd" in reps else ():
                print(f"    raypd {kind} steps: {t['steps']}, CPU {t['cpu_ms_p50']:.2f} ms, GPU busy "
                      f"{t['gpu_ms_p50']:.2f} ms (medians)", flush=True)
            if "raypd" in outs:
                last = reps["raypd"][str(c)][-1]
                slow = ", ".join(f"{x['wall_ms']:.1f} ms ({x.get('kind', 'step')})" for x in last["slowest_steps"])
                print(f"    raypd slowest steps: {slow}; GC: {last['gc']['full_collections']} full collections, "
                      f"longest pause {last['gc']['max_ms']:.1f} ms; Triton compiles in the run: "
                      f"{last['triton_compiles']['count']} ({last['triton_compiles']['total_s']:.2f} s)", flush=True)

    if "kernels_per_decode_step" in info:
        k = info["kernels_per_decode_step"]
        print(f"  one decode step of {k.get('rows')} sequences launches {k.get('kernels')} kernels "
              f"({k.get('per_layer', 0):.1f} per layer): {k.get('by_kernel', k.get('error'))}")
    results = {n: {c: median_summary(v) for c, v in per.items()} for n, per in reps.items()}
    for peer in ("hf", "llamacpp"):
        for c, s in results.get("raypd", {}).items() if peer in results else ():
            s[f"ratio_vs_{peer}"] = s["output_tok_s"] / results[peer][c]["output_tok_s"]
    for c, s in results.get("raypd", {}).items() if "hf" in results else ():
        s["hf_identical_tokens_frac"] = match.get(c)
    agreement = fp32_agreement(args, work, tokens) if args.fp32_agreement else {}
    print()
    print_table(results, args.concurrency)
    if match:
        print("requests whose raypd and hf tokens are identical: "
              + ", ".join(f"C={c}: {100 * f:.0f}%" for c, f in match.items()))
    for name, (tok_share, req_share) in agreement.items():
        print(f"{name} against raypd float32 (C={max(args.concurrency)}): {tok_share:.1%} of greedy tokens "
              f"before the first difference, {req_share:.1%} of requests identical")

    report: dict[str, Any] = {"command": shlex.join([sys.executable, *sys.argv]), "args": {k: (str(v) if isinstance(v, Path) else v)
              for k, v in vars(args).items()}, "machine": info, "results": results, "repeats": reps,
              "fp32_agreement": {n: {"token_share": t, "request_share": r} for n, (t, r) in agreement.items()},
              "workload": {"prompt_tokens": sum(len(r.prompt_token_ids) for r in work),
                           "output_tokens": sum(r.max_tokens for r in work)}}
    if args.profile:
        del hf
        report["profile"] = profile_raypd(args, work, max(args.concurrency), args.profile)
        print_profile(report["profile"])
    report["machine"]["loadavg_end"] = os.getloadavg()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        print(f"\nwrote {args.json}")
    return report


if __name__ == "__main__":
    main()
