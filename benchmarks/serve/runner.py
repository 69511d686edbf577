"""One run: a workload sent to one endpoint at given session start times, every result kept.

Each session waits for its start time, then sends its requests one after another; with
`max_concurrency` a request also waits for one of that many slots (a closed loop when every start
is 0). Requests that had not started when `deadline_s` passed are recorded as `not_sent` errors,
so an overloaded system cannot stretch a run without bound. Progress goes to stderr.
"""
from __future__ import annotations

import asyncio
import importlib
import sys
import time
from dataclasses import dataclass

import aiohttp

from raypd.benchmarks.serve.client import Result, send
from raypd.benchmarks.serve.datasets import Workload


@dataclass(frozen=True)
class Target:
    """An OpenAI-compatible endpoint: base URL ending in /v1, the model id to send, extra body fields."""
    base_url: str
    model: str
    extra_body: dict
    headers: dict | None = None


@dataclass
class RunResult:
    results: list[Result]
    duration_s: float
    offered_rate: float | None


async def fetch_model(base_url: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(base_url.rstrip("/") + "/models") as resp:
        resp.raise_for_status()
        data = (await resp.json())["data"]
        return str(data[0]["id"])


def run(target: Target, workload: Workload, starts: list[float], max_concurrency: int | None, timeout_s: float,
        deadline_s: float | None = None, label: str = "", offered_rate: float | None = None) -> RunResult:
    return asyncio.run(_run(target, workload, starts, max_concurrency, timeout_s, deadline_s, label, offered_rate))


async def _run(target: Target, workload: Workload, starts: list[float], max_concurrency: int | None,
               timeout_s: float, deadline_s: float | None, label: str, offered_rate: float | None) -> RunResult:
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    progress = _progress(workload.num_requests, label)
    results: list[Result] = []
    # A connection per request: llama.cpp's server closes idle keep-alive connections, and a request
    # sent on one just as it closes would count as the server's failure.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as http:
        t0 = time.perf_counter()

        async def one(req) -> Result:
            if deadline_s is not None and time.perf_counter() - t0 > deadline_s:
                return Result(error="not_sent", detail="run deadline passed", max_tokens=req.max_tokens,
                              start_s=time.perf_counter() - t0)
            if sem is None:
                return await send(http, target.base_url, req, target.model, target.extra_body, timeout_s, t0,
                                  target.headers)
            async with sem:
                return await send(http, target.base_url, req, target.model, target.extra_body, timeout_s, t0,
                                  target.headers)

        async def session(s, start: float) -> None:
            await asyncio.sleep(max(0.0, start - (time.perf_counter() - t0)))
            for turn, req in enumerate(s.requests, 1):
                res = await one(req)
                res.turn = turn
                results.append(res)
                progress(res)

        await asyncio.gather(*(session(s, t) for s, t in zip(workload.sessions, starts)))
        duration = time.perf_counter() - t0
    progress(None)
    return RunResult(results, duration, offered_rate)


def _progress(total: int, label: str):
    """A tqdm bar when tqdm is installed (it comes with Ray), else one rewritten stderr line."""
    try:
        tqdm = importlib.import_module("tqdm")  # no type stubs; Ray installs it
    except ImportError:
        tqdm = None
    if tqdm is not None:
        bar = tqdm.tqdm(total=total, desc=label, unit="req", file=sys.stderr, leave=False)

        def update(res: Result | None) -> None:
            if res is None:
                bar.close()
            else:
                bar.update(1)
        return update
    done = [0, 0]

    def line(res: Result | None) -> None:
        if res is not None:
            done[0] += 1
            done[1] += 0 if res.ok else 1
        print(f"\r{label} {done[0]}/{total} requests, {done[1]} errors", end="\n" if res is None else "",
              file=sys.stderr, flush=True)
    return line
