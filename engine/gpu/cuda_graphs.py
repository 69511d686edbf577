"""CUDA graphs for decode-only steps: capture the whole forward once per padded batch size, replay it.

Why: an eager decode step launches every kernel of every layer from Python (hundreds of launches
for a 16-layer model even with fused kernels), and on a fast GPU the launches, not the GPU, are the
step's time. A replayed graph is one launch for the whole forward.

Buckets (graph_batch_sizes): 1, 2, 4, 8, then every 8 up to 64, then every 16 up to the engine's
max_running_requests, which is always captured. A step of n sequences replays the smallest bucket
>= n; its rows n..bucket-1 are padding:

    input      real row                         padding row
    token id   the request's next input token   0
    position   its position                     0
    slot       block * block_size + offset      -1: its K/V is not written
    context    tokens including this one        0: attention returns zeros
    table      the request's block ids          0 (never read: the context is empty)

Only decode-only steps whose longest context fits the captured table width replay; a step with a
prefill chunk runs eagerly (its shapes vary with the chunks). The inputs live in static device
buffers that every graph reads through views of its first `bucket` rows; each replay first copies
the step's rows into them. Graphs share one memory pool, captured largest first (the smaller ones
reuse its blocks), so their memory is about that of the largest.

GraphFactory is the seam for tests: the CUDA one captures torch.cuda.CUDAGraph; a fake one (tests)
just calls the function again, so the bucket and padding logic runs on the CPU.
"""
from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

SMALL_SIZES = (1, 2, 4, 8)


def graph_batch_sizes(max_batch: int) -> list[int]:
    """The padded batch sizes captured for an engine running at most max_batch sequences."""
    sizes = [s for s in SMALL_SIZES if s < max_batch]
    sizes += range(16, min(64, max_batch - 1) + 1, 8)
    sizes += range(80, max_batch, 16)
    return sorted(set(sizes) | {max_batch})


def bucket_for(n: int, sizes: list[int]) -> int | None:
    """The smallest captured size that holds n sequences, or None when n exceeds them all."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


class CapturedStep(Protocol):
    def replay(self) -> None: ...


class GraphFactory(Protocol):
    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[CapturedStep, torch.Tensor]:
        """Capture fn; returns the replayable step and the tensor each replay writes fn's result to."""
        ...


class CudaGraphFactory:
    """torch.cuda.CUDAGraph on one shared memory pool, each function run once on a side stream first
    (warm-up: Triton compiles, cuBLAS picks its kernels and workspace) as capture requires."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[CapturedStep, torch.Tensor]:
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        torch.cuda.synchronize(self.device)
        return graph, out


@dataclass(frozen=True, slots=True)
class DecodeInputs:
    """A decode step's inputs as the forward reads them: views of the static buffers (graphs) or
    fresh tensors (eager)."""
    input_ids: torch.Tensor   # [B] int64
    positions: torch.Tensor   # [B] int64
    slots: torch.Tensor       # [B] int64, -1 for padding
    ctx_lens: torch.Tensor    # [B] int32, 0 for padding
    tables: torch.Tensor      # [B, W] int32

    def rows(self, n: int) -> DecodeInputs:
        return DecodeInputs(self.input_ids[:n], self.positions[:n], self.slots[:n], self.ctx_lens[:n], self.tables[:n])


@dataclass(slots=True)
class DecodeHostRows:
    """A decode step's rows on the host (numpy), built by the runner: n real rows."""
    input_ids: np.ndarray  # [n] int64
    positions: np.ndarray  # [n] int64
    slots: np.ndarray      # [n] int64
    ctx_lens: np.ndarray   # [n] int32
    tables: np.ndarray     # [n, w] int32, w <= the graphs' width


class DecodeGraphs:
    """One captured forward per bucket over shared static inputs; run() pads, copies and replays."""

    def __init__(self, forward: Callable[[DecodeInputs], torch.Tensor], max_batch: int, max_blocks: int,
                 device: torch.device, factory: GraphFactory):
        """forward(inputs) -> logits [B, vocab] for every row (the runner's model call)."""
        self.sizes = graph_batch_sizes(max_batch)
        self.max_blocks = max_blocks
        self.device = device
        # Host staging (pinned on CUDA, so the copies are asynchronous DMA) and the device buffers.
        # Two staging sets, used in turn: with overlap scheduling a step's rows are written while
        # the previous step's copies may still wait in the stream (they have run by the step after,
        # whose host work begins after that step's tokens were waited for).
        pin = device.type == "cuda"
        self._hosts = [DecodeInputs(*(torch.zeros(shape, dtype=dtype, pin_memory=pin) for shape, dtype in self._shapes()))
                       for _ in range(2)]
        self.static = DecodeInputs(*(torch.zeros(shape, dtype=dtype, device=device) for shape, dtype in self._shapes()))
        # Overlap scheduling (engine/overlap.py): per row, where its input token is in the previous
        # step's device tokens (-1: the host knows it), staged like the inputs.
        self._host_sources = [torch.zeros(self.sizes[-1], dtype=torch.int64, pin_memory=pin) for _ in range(2)]
        self._sources = torch.zeros(self.sizes[-1], dtype=torch.int64, device=device)
        self._turn = 0
        self._graphs: dict[int, tuple[CapturedStep, torch.Tensor]] = {}
        for size in reversed(self.sizes):  # largest first: the smaller graphs reuse its pool
            self._graphs[size] = factory.capture(self._bound(forward, size))

    def _bound(self, forward: Callable[[DecodeInputs], torch.Tensor], size: int) -> Callable[[], torch.Tensor]:
        static = self.static.rows(size)
        return lambda: forward(static)

    def _shapes(self) -> list[tuple[tuple[int, ...], torch.dtype]]:
        b = self.sizes[-1]
        return [((b,), torch.int64), ((b,), torch.int64), ((b,), torch.int64), ((b,), torch.int32),
                ((b, self.max_blocks), torch.int32)]

    def serves(self, n: int, widest_table: int) -> bool:
        """Whether a decode-only step of n sequences whose longest block table has widest_table
        blocks can replay a graph."""
        return n <= self.sizes[-1] and widest_table <= self.max_blocks

    def run(self, rows: DecodeHostRows, previous: torch.Tensor | None = None,
            sources: np.ndarray | None = None) -> torch.Tensor:
        """Replay the bucket for rows; returns the logits of the real rows, [n, vocab] (a view of the
        graph's output buffer: valid until the next replay). previous, sources (overlap scheduling):
        row i's input token is previous[sources[i]] where sources[i] >= 0, taken on the device."""
        n = rows.input_ids.shape[0]
        size = bucket_for(n, self.sizes)
        assert size is not None and rows.tables.shape[1] <= self.max_blocks, "serves() was not asked"
        self._turn ^= 1
        host = self._hosts[self._turn].rows(size)
        for buf, real, pad in ((host.input_ids, rows.input_ids, 0), (host.positions, rows.positions, 0),
                               (host.slots, rows.slots, -1), (host.ctx_lens, rows.ctx_lens, 0)):
            view = buf.numpy()
            view[:n] = real
            view[n:] = pad
        tables = host.tables.numpy()
        tables[:n, :rows.tables.shape[1]] = rows.tables
        tables[n:] = 0
        static = self.static.rows(size)
        for dst, src in zip((static.input_ids, static.positions, static.slots, static.ctx_lens, static.tables),
                            (host.input_ids, host.positions, host.slots, host.ctx_lens, host.tables)):
            dst.copy_(src, non_blocking=True)
        if previous is not None and sources is not None:
            staged = self._host_sources[self._turn][:n]
            staged.numpy()[:] = sources
            src = self._sources[:n]
            src.copy_(staged, non_blocking=True)
            ids = static.input_ids[:n]
            ids.copy_(torch.where(src >= 0, previous[src.clamp(min=0)], ids))
        graph, out = self._graphs[size]
        graph.replay()
        return out[:n]
