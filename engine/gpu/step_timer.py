"""Per-step timing for benchmarks: how long the GPU was busy with a step's forward (CUDA events
around it) and how long the host waited for it, so that the step's CPU time is its wall time less
that wait. The runner calls begin() once a step's decode rows are built, before anything is
launched, and end() once the forward is launched; end() waits for the GPU (the step's one
synchronisation comes a moment earlier than it would, not in addition) and times the wait.

    kind           what ran
    graph          a decode-only step replayed from a CUDA graph
    eager-decode   a decode-only step run eagerly (no graphs, or a batch or context past them)
    mixed          decode tokens with prefill chunks
    prefill        prefill chunks only
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class StepTime:
    kind: str
    num_decode: int
    gpu_s: float   # first launch to the end of the forward on the GPU (CUDA events)
    wait_s: float  # the host blocked on the GPU


class StepTimer:
    def __init__(self) -> None:
        self.steps: list[StepTime] = []
        self._start: torch.cuda.Event | None = None

    def begin(self) -> None:
        self._start = torch.cuda.Event(enable_timing=True)
        self._start.record()

    def end(self, kind: str, num_decode: int) -> None:
        assert self._start is not None, "end() without begin()"
        stop = torch.cuda.Event(enable_timing=True)
        stop.record()
        t0 = time.perf_counter()
        stop.synchronize()
        wait = time.perf_counter() - t0
        self.steps.append(StepTime(kind, num_decode, self._start.elapsed_time(stop) / 1e3, wait))
        self._start = None
