"""`raypd bench gpu-smoke`: what works on this GPU host, in one command, for a user to paste into an issue.

No GPU has ever run raypd's CUDA paths in this project's CI; this is how the first user with one
tells us what works. Steps, each with its own timeout, each run whatever the previous ones gave:

    environment    versions (raypd, python, torch and its CUDA build, ray, transformers, nixl), the
                   GPUs torch sees (name, memory, compute capability, bf16)
    engine         greedy tokens on the device (--dtype auto, then float32) against the engine on
                   the CPU in float32 (the parity reference): share of identical tokens, first tokens
    full-context   max_running_requests requests at the model's full context, all at once, the KV
                   pool sized by utilization: every one finishes, no out-of-memory, no leaked block
    bench-engine   `raypd bench engine --systems raypd --device DEVICE [--model MODEL]` at concurrency 1 and 32
    generate-pd    `raypd generate --mode pd`, 1 prefill + 1 decode node sharing the one GPU
                   (--gpus-per-node 0.5), greedy tokens against the engine step's

The report (stdout, and --json) says for each step ok or the error and the tail of its output. Exit
status 0 when every step passed, 1 when one failed, 2 when the device is missing: on a host
without CUDA the command stops after `environment` and says why. `--device cpu` runs the same
steps on the CPU, which is how CI checks this script.

    raypd bench gpu-smoke --json gpu-smoke.json
    raypd bench gpu-smoke --device cpu --quick      (the rehearsal CI runs)
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from raypd.benchmarks.workloads import greedy_agreement

PROMPTS = ["The capital of France is", "Write a haiku about the sea.", "List three prime numbers:",
           "Explain in one sentence what a GPU does."]
QUICK_BENCH = ("--num-requests", "4", "--prompt-len-range", "20,40", "--max-tokens-range", "4,8")
PACKAGES = ("raypd", "torch", "ray", "transformers", "nixl", "nixl-cu12", "safetensors", "gguf")


@dataclass
class Step:
    name: str
    ok: bool = False
    seconds: float = 0.0
    result: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def environment() -> dict[str, Any]:
    import torch
    versions = {"python": platform.python_version(), "platform": platform.platform()}
    for pkg in PACKAGES:
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            continue
    out: dict[str, Any] = {"versions": versions, "torch_cuda_build": torch.version.cuda,
                           "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        out["gpus"] = [{"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                        "capability": f"{p.major}.{p.minor}"} for p in map(torch.cuda.get_device_properties,
                                                                             range(torch.cuda.device_count()))]
        out["bf16_supported"] = torch.cuda.is_bf16_supported()
    return out


def device_missing(device: str, env: dict[str, Any]) -> str | None:
    """Why `device` cannot run here, or None."""
    if not device.startswith("cuda") or env["cuda_available"]:
        return None
    build = env["torch_cuda_build"] or "none: a CPU-only wheel"
    return (f"no CUDA device: torch {env['versions'].get('torch')} (CUDA build {build}) sees no GPU. "
            "Install a CUDA build of torch and check nvidia-smi, then run this again.")


def greedy_tokens(model: str | None, device: str, dtype: str, max_tokens: int) -> tuple[list[list[int]], str]:
    from raypd.engine import LLM, SamplingParams
    llm = LLM(model, device=device, dtype=dtype)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    return [o.token_ids for o in outs], str(llm.engine.kv_cache.pool.dtype)


def engine_step(args, reference: dict[str, Any]) -> dict[str, Any]:
    cpu, _ = greedy_tokens(args.model, "cpu", "float32", args.max_tokens)
    reference["cpu_float32"] = cpu
    out: dict[str, Any] = {}
    for dtype in ("auto", "float32"):
        tokens, pool = greedy_tokens(args.model, args.device, dtype, args.max_tokens)
        reference[f"{args.device}_{dtype}"] = tokens
        share, whole = greedy_agreement(tokens, cpu)
        out[dtype] = {"kv_dtype": pool, "identical_token_share": round(share, 4), "identical_requests": round(whole, 4),
                      "first_tokens_agree": all(a[:1] == b[:1] for a, b in zip(tokens, cpu))}
    if not out["float32"]["first_tokens_agree"]:
        raise AssertionError(f"float32 on {args.device} disagrees with the CPU on a first token: {out}")
    return out


def full_context(model: str | None, device: str, requests: int | None = None, max_tokens: int = 32,
                 context: int | None = None, **engine_options: Any) -> dict[str, Any]:
    """The engine at its model's full context (or `context` tokens, when smaller) under load:
    `requests` (default: the device's max_running_requests) prompts of distinct tokens that fill the
    context but for max_tokens, all added at once, the KV pool sized by --gpu-memory-utilization as
    a node's is. Every request must finish with all its tokens (retractions allowed): an
    out-of-memory error, a short request or a leaked block fails the step. What the KV sizing
    promises (engine/kv_memory.py)."""
    import numpy as np

    from raypd.engine import LLMEngine, SamplingParams
    engine = LLMEngine(model, device=device, **engine_options)
    rows = requests or engine.config.max_running_requests
    context = min(context or engine.model_config.max_position_embeddings, engine.model_config.max_position_embeddings)
    prompt_len = context - max_tokens - 1
    rng = np.random.default_rng(0)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i in range(rows):
        engine.add_request(rng.integers(0, engine.model_config.vocab_size, prompt_len).tolist(), params, f"full-{i}")
    tokens: dict[str, int] = {}
    t0 = time.perf_counter()
    while engine.has_unfinished():
        for o in engine.step():
            tokens[o.request_id] = tokens.get(o.request_id, 0) + len(o.new_token_ids)
    wall = time.perf_counter() - t0
    short = [rid for rid in (f"full-{i}" for i in range(rows)) if tokens.get(rid) != max_tokens]
    if short:
        raise AssertionError(f"{len(short)} of {rows} requests did not get their {max_tokens} tokens: {short[:4]}")
    engine.check_block_integrity()
    out: dict[str, Any] = {"requests": rows, "prompt_tokens": prompt_len, "context": context, "seconds": round(wall, 2),
                           "kv_blocks": engine.num_blocks, "kv_tokens": engine.num_blocks * engine.config.block_size,
                           "retractions": engine.scheduler.num_retractions, "backend": engine.backend}
    if engine.device.type == "cuda":
        import torch
        out["max_allocated_gib"] = round(torch.cuda.max_memory_allocated(engine.device) / 2**30, 2)
        free, total = torch.cuda.mem_get_info(engine.device)
        out["device_used_gib"] = round((total - free) / 2**30, 2)
    return out


def run_command(cmd: list[str], log: Path, timeout_s: float) -> str:
    """Run a raypd command in its own process group; stop everything it started, by pid, always."""
    from raypd.benchmarks.serve.systems import Launched  # psutil: not needed by the engine steps
    proc = Launched.start(log.stem, cmd, 0, log)
    deadline = time.monotonic() + timeout_s
    try:
        while proc.proc.poll() is None and time.monotonic() < deadline:
            proc.remember()
            time.sleep(0.5)
        code = proc.proc.poll()
    finally:
        left = proc.stop(grace_s=30)
    if code != 0:
        why = f"timed out after {timeout_s:.0f}s" if code is None else f"exited with {code}"
        raise RuntimeError(f"`{' '.join(cmd[2:])}` {why}:\n{proc.log_tail(2000)}")
    if left:
        raise RuntimeError(f"`{' '.join(cmd[2:])}` left processes {left} running")
    return log.read_text(errors="replace")


def bench_engine_step(args, workdir: Path) -> dict[str, Any]:
    out_json = workdir / "bench_engine.json"
    run_command([sys.executable, "-m", "raypd", "bench", "engine", "--systems", "raypd", "--device", args.device,
                 "--concurrency", "1,32", *(QUICK_BENCH if args.quick else ()), *(["--model", args.model] if args.model else ()),
                 "--json", str(out_json)],
                workdir / "bench_engine.log", args.step_timeout)
    results = json.loads(out_json.read_text())["results"]["raypd"]
    return {f"C={c}": {"output_tok_s": round(s["output_tok_s"], 1), "ttft_p50_ms": round(1e3 * s["ttft_p50_s"], 1),
                       "tpot_p50_ms": round(1e3 * s["tpot_p50_s"], 2)} for c, s in results.items()}


def generate_pd_step(args, workdir: Path, reference: dict[str, Any]) -> dict[str, Any]:
    # Two node actors share the host's one GPU: half of it each, and each sizes its KV pool from
    # under half of the device's memory (the start-up check wants that much free).
    on_gpu = ["--gpus-per-node", "0.5", "--gpu-memory-utilization", "0.4"]
    cmd = [sys.executable, "-m", "raypd", "generate", "--mode", "pd", "--prefill-nodes", "1", "--decode-nodes", "1",
           *(["--gpus-per-node", "0"] if args.device == "cpu" else on_gpu), "--max-tokens", str(args.max_tokens),
           "--json", *PROMPTS]
    if args.model:
        cmd += ["--model", args.model]
    text = run_command(cmd, workdir / "generate_pd.log", args.step_timeout)
    rows = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    if len(rows) != len(PROMPTS):
        raise RuntimeError(f"expected {len(PROMPTS)} JSON lines, got {len(rows)}:\n{text[-2000:]}")
    tokens = [r["token_ids"] for r in rows]
    same = reference.get(f"{args.device}_auto")
    out: dict[str, Any] = {"texts": [r["text"][:80] for r in rows]}
    if same is not None:
        share, whole = greedy_agreement(tokens, same)
        out["identical_to_engine_step"] = {"token_share": round(share, 4), "requests": round(whole, 4)}
    return out


def run_step(name: str, fn: Callable[[], dict[str, Any]]) -> Step:
    step, t0 = Step(name), time.perf_counter()
    print(f"[{name}] ...", flush=True)
    try:
        step.result, step.ok = fn(), True
    except Exception as e:  # noqa: BLE001 - a failed step is reported, the next one still runs
        step.error = f"{type(e).__name__}: {e}\n" + "".join(traceback.format_exc(limit=3)[-1500:])
    step.seconds = round(time.perf_counter() - t0, 1)
    print(f"[{name}] {'ok' if step.ok else 'FAILED'} in {step.seconds}s: "
          f"{json.dumps(step.result) if step.ok else step.error}", flush=True)
    return step


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu to rehearse the steps")
    ap.add_argument("--model", help="Hugging Face folder or .gguf (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="a tiny bench-engine workload (4 short requests), to "
                    "check that every step runs rather than how fast")
    ap.add_argument("--step-timeout", type=float, default=1800.0, help="seconds per command step")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    report: dict[str, Any] = {"command": " ".join(["raypd bench gpu-smoke", *(argv or sys.argv[1:])]),
                              "device": args.device, "steps": []}
    reference: dict[str, Any] = {}
    steps = [run_step("environment", environment)]
    missing = device_missing(args.device, steps[0].result) if steps[0].ok else None
    if missing:
        steps[0].ok, steps[0].error = False, missing
        print(f"[environment] {missing}", flush=True)
        code = 2
    else:
        with tempfile.TemporaryDirectory(prefix="raypd-gpu-smoke-") as tmp:
            workdir = Path(tmp)
            steps += [run_step("engine", lambda: engine_step(args, reference)),
                      run_step("full-context", lambda: full_context(
                          args.model, args.device, *((4, 16, 256) if args.quick else ()))),
                      run_step("bench-engine", lambda: bench_engine_step(args, workdir)),
                      run_step("generate-pd", lambda: generate_pd_step(args, workdir, reference))]
        code = 0 if all(s.ok for s in steps) else 1
    report["steps"] = [asdict(s) for s in steps]
    report["passed"] = code == 0
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    print("gpu-smoke: " + ("every step passed" if code == 0 else "see the failed steps above") +
          "; please attach the output (or --json) to an issue")
    return code


if __name__ == "__main__":
    sys.exit(main())
