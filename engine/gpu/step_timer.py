"""Per-step timing for benchmarks: for each call of LLMEngine.step(), what kind of forward it launched,
how long the GPU was busy with that forward (CUDA events around it) and how long the call blocked on
the GPU, so that the call's CPU time is its wall time less that wait.

The runner reports launched() once a forward's inputs are built and the forward is launched (with
the events around it) and waited() for every host block on the GPU (the sampled tokens' copy); the
benchmark closes each step() call with close_call(). Without overlap a call waits for the forward
it launched; with overlap scheduling (engine/overlap.py) it waits for the previous one, while its
own runs. The GPU times are read at the end (summary time), when every event has completed.

    kind           what ran
    graph          a decode-only step replayed from a CUDA graph
    eager-decode   a decode-only step run eagerly (no graphs, or a batch or context past them)
    mixed          decode tokens with prefill chunks
    prefill        prefill chunks only
    none           the call launched nothing (it only collected the last step's tokens)
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class StepTime:
    kind: str
    num_decode: int
    wait_s: float  # the call blocked on the GPU
    events: tuple[torch.cuda.Event, torch.cuda.Event] | None  # around the forward it launched

    @property
    def gpu_s(self) -> float:
        """First launch to the end of the forward on the GPU (its events must have completed)."""
        return 0.0 if self.events is None else self.events[0].elapsed_time(self.events[1]) / 1e3


class StepTimer:
    def __init__(self) -> None:
        self.steps: list[StepTime] = []
        self._start: torch.cuda.Event | None = None
        self._call = StepTime("none", 0, 0.0, None)

    def begin(self) -> None:
        """Before the forward's first launch."""
        self._start = torch.cuda.Event(enable_timing=True)
        self._start.record()

    def launched(self, kind: str, num_decode: int) -> None:
        """After the forward's last launch."""
        assert self._start is not None, "launched() without begin()"
        stop = torch.cuda.Event(enable_timing=True)
        stop.record()
        self._call.kind, self._call.num_decode, self._call.events = kind, num_decode, (self._start, stop)
        self._start = None

    def wait_launched(self) -> None:
        """Block until the forward reported by launched() completes."""
        assert self._call.events is not None, "wait_launched() before launched()"
        self.wait(self._call.events[1])

    def wait(self, event: torch.cuda.Event) -> None:
        """Block until `event` completes, timing the wait."""
        t0 = time.perf_counter()
        event.synchronize()
        self._call.wait_s += time.perf_counter() - t0

    def close_call(self) -> None:
        self.steps.append(self._call)
        self._call = StepTime("none", 0, 0.0, None)
