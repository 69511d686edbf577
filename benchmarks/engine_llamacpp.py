"""llama.cpp's `llama-server` as the peer of `raypd bench engine`: the same token-id workload, closed loop.

One server per concurrency level (`--parallel` = C slots, so none waits for a slot; `-t` = the
engine's threads), on the GGUF raypd loads by default, started and stopped through the serve
benchmark's launcher (benchmarks/serve/systems.py: by process group, then by pid). C client threads
each stream one request at a time from its native `/completion` endpoint:

    {"prompt": [token ids], "n_predict": max_tokens, "temperature": 0, "ignore_eos": true,
     "cache_prompt": false, "stream": true, "return_tokens": true}

so llama.cpp neither tokenizes nor reuses a prompt (the workload shares none), and every request
produces exactly max_tokens greedy tokens, as in the engine's run. Each streamed event's tokens are
timestamped when the event arrives; a request's clock starts when it is sent. The HTTP hop costs
llama.cpp well under a millisecond per token here, against tens of milliseconds per step.
"""
from __future__ import annotations

import http.client
import json
import queue
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from raypd.benchmarks.serve.llamacpp_build import find_or_build_llama_server
from raypd.benchmarks.serve.sse import SSEParser
from raypd.benchmarks.serve.systems import LaunchError, LaunchOptions, launch
from raypd.benchmarks.workloads import BenchRequest

REQUEST_TIMEOUT_S = 1800.0  # one request's whole stream; a server that stops answering fails the run


class LlamaCppPeer:
    """Starts llama-server per concurrency level; `run(work, conc)` returns (records, wall) like run_raypd."""

    def __init__(self, threads: int, server: Path | None, log_dir: Path | None, slot_context: int):
        self.threads = threads
        self.server = server or find_or_build_llama_server()
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="raypd-bench-llamacpp-"))
        self.slot_context = slot_context

    def version(self) -> str:
        out = subprocess.run([str(self.server), "--version"], capture_output=True, text=True, timeout=60)
        return (out.stdout + out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else "unknown"

    def run(self, work: list[BenchRequest], conc: int) -> tuple[list[dict], float]:
        opts = LaunchOptions(cpus=self.threads / 2, slots=conc, slot_context=self.slot_context,
                             llama_server=self.server, ready_timeout_s=300.0)
        server = launch("llamacpp", opts, self.log_dir)
        try:
            _stream_one(server.port, BenchRequest("warmup", work[0].prompt_token_ids[:8], 8))
            return _closed_loop(server.port, work, conc)
        finally:
            left = server.stop()
            if left:
                raise LaunchError(f"llama-server left processes {left} running")


def _closed_loop(port: int, work: list[BenchRequest], conc: int) -> tuple[list[dict], float]:
    todo: queue.Queue[BenchRequest] = queue.Queue()
    for r in work:
        todo.put(r)
    recs: dict[str, dict[str, Any]] = {}
    errors: list[BaseException] = []

    def client() -> None:
        while not errors:
            try:
                r = todo.get_nowait()
            except queue.Empty:
                return
            try:
                recs[r.request_id] = _stream_one(port, r)
            except BaseException as e:  # noqa: BLE001 - reported after the join
                errors.append(e)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(conc)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(REQUEST_TIMEOUT_S * len(work))
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"llama.cpp: {errors[0]!r}") from errors[0]
    for r in work:
        got = len(recs[r.request_id]["tokens"])
        if got != r.max_tokens:
            raise RuntimeError(f"llama.cpp: {r.request_id} gave {got} tokens, not {r.max_tokens}")
    return [recs[r.request_id] for r in work], wall


def _stream_one(port: int, r: BenchRequest) -> dict[str, Any]:
    body = json.dumps({"prompt": r.prompt_token_ids, "n_predict": r.max_tokens, "temperature": 0.0,
                       "ignore_eos": True, "cache_prompt": False, "stream": True, "return_tokens": True})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
    rec: dict[str, Any] = {"sent": time.perf_counter(), "times": [], "tokens": [], "cached": 0}
    try:
        conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read(2000)!r}")
        parser = SSEParser()
        while chunk := resp.read1(65536):
            now = time.perf_counter()
            for payload in parser.feed(chunk):
                event = json.loads(payload)
                tokens = event.get("tokens") or []
                rec["times"] += [now] * len(tokens)
                rec["tokens"] += tokens
                if event.get("stop"):
                    return rec
        raise RuntimeError(f"{r.request_id}: the stream ended without its final event")
    finally:
        conn.close()
