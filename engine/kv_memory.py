"""How many KV blocks an engine gets.

CPU: an explicit budget, `kv_cache_memory_mb` (default DEFAULT_CPU_KV_MB): host RAM is shared with
everything else on the machine and there is nothing to measure it against.

CUDA, with `gpu_memory_utilization` F (vLLM's meaning): this engine may use F of the device's total
memory, for weights, the activations of its largest batch and the KV pool together. After the
weights are loaded the engine runs one peak batch (PeakBatch: max_num_batched_tokens prompt tokens
spread over max_running_requests sequences, so the step also samples the most rows) on a small
temporary pool, reads the peak it allocated, and gives the KV pool what is left:

    kv_bytes = total * F - peak_allocated_in_profile - memory_outside_torch

memory_outside_torch is what this process holds beyond torch's allocator (the CUDA context, cuBLAS
workspaces, NCCL or NIXL registrations). It is read per process: the driver's count of this
process's memory (NVML) minus what torch reserved. The device's free memory must not be used for
it: two node actors sharing a GPU start at the same time, and the other one's KV pool, allocated
between this one's readings, would be counted as this one's (a start-order-dependent failure seen
on an H200). Only where NVML cannot see this process (no pynvml, a container hiding pids) does it
fall back to the free-memory difference, with a warning. Graph memory (CUDA graphs captured for
decode steps) is added to the profiled peak by the engine.

Like vLLM, start-up fails when the device's free memory is below total * F (another process holds
it), rather than overcommitting and dying at the first long batch.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Protocol

import torch

from raypd.engine.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_CPU_KV_MB = 1024
GiB = 2 ** 30


@dataclass(frozen=True, slots=True)
class MemoryReading:
    total: int           # the device's memory
    free: int            # free on the device, for any process (the driver's view)
    peak_allocated: int  # the most torch's allocator held in this process since the last reset
    reserved: int        # what torch's caching allocator holds now
    process_used: int | None = None  # this process's device memory per the driver (NVML); None: unknown


class DeviceMemory(Protocol):
    """What sizing reads from a device (CudaMemory; tests give fixed numbers)."""

    def reset_peak(self) -> None: ...

    def read(self) -> MemoryReading: ...


class CudaMemory:
    def __init__(self, device: torch.device):
        self.device = device

    def reset_peak(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)

    def read(self) -> MemoryReading:
        torch.cuda.synchronize(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        return MemoryReading(total=total, free=free, peak_allocated=torch.cuda.max_memory_allocated(self.device),
                             reserved=torch.cuda.memory_reserved(self.device), process_used=self._process_used())

    def _process_used(self) -> int | None:
        """This process's memory on the device as NVML counts it, or None where NVML cannot tell."""
        try:
            import pynvml  # nvidia-ml-py
            pynvml.nvmlInit()
            # Every GPU's processes, not one handle: NVML numbers GPUs apart from CUDA_VISIBLE_DEVICES
            # (which Ray sets), and an engine's process uses one GPU, so its sum is that GPU's.
            procs = [p for i in range(pynvml.nvmlDeviceGetCount())
                     for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))]
        except Exception:  # noqa: BLE001 - no NVML, no permission, an older driver: fall back
            return None
        mine = [p.usedGpuMemory for p in procs if p.pid == os.getpid() and p.usedGpuMemory]
        return int(sum(mine)) if mine else None


def check_free_at_start(start: MemoryReading, utilization: float) -> None:
    """Refuse to start when another process already holds what this engine was promised."""
    wanted = start.total * utilization
    if start.free < wanted:
        raise ConfigError(
            f"the GPU has {start.free / GiB:.2f} GiB free of {start.total / GiB:.2f} GiB, less than "
            f"--gpu-memory-utilization {utilization} asks for ({wanted / GiB:.2f} GiB): another process is "
            "using it; lower the utilization (e.g. 0.45 for two node actors on one GPU) or free the device")


def gpu_kv_bytes(start: MemoryReading, after_profile: MemoryReading, utilization: float) -> int:
    """The KV pool's bytes from the readings before loading (start) and after the peak batch."""
    if after_profile.process_used is not None:
        outside_torch = max(0, after_profile.process_used - after_profile.reserved)
    else:
        log.warning("NVML cannot see this process's GPU memory: the memory outside torch is read from the device's "
                    "free memory, which counts what other processes allocated meanwhile")
        outside_torch = max(0, (start.free - after_profile.free) - after_profile.reserved)
    budget = int(start.total * utilization) - after_profile.peak_allocated - outside_torch
    if budget <= 0:
        raise ConfigError(
            f"no memory left for the KV cache: --gpu-memory-utilization {utilization} of "
            f"{start.total / GiB:.2f} GiB is {start.total * utilization / GiB:.2f} GiB, and the weights with "
            f"the peak batch take {after_profile.peak_allocated / GiB:.2f} GiB (+{outside_torch / GiB:.2f} GiB "
            "outside torch); raise the utilization or lower --max-num-batched-tokens")
    return budget


def torch_decode_gather_bytes(batch: int, context: int, num_heads: int, num_kv_heads: int, head_dim: int,
                              dtype_bytes: int) -> int:
    """The torch attention path's decode temporaries at `batch` sequences of `context` tokens: each
    sequence's keys and values of one layer gathered out of the pool, [batch, kv_heads, context,
    head_dim] twice in the pool's dtype, and the scores, [batch, heads, context] in float32 where
    SDPA materializes them. Freed after each layer, so one layer's worth is the peak; the profile
    batch (short prompts) never reaches it, so the engine adds it (model/attention.py)."""
    return batch * context * (2 * num_kv_heads * head_dim * dtype_bytes + num_heads * 4)


def blocks_for_bytes(kv_bytes: int, bytes_per_block: int, what: str) -> int:
    n = kv_bytes // bytes_per_block
    if n < 1:
        raise ConfigError(f"{what} holds no {bytes_per_block}-byte KV block")
    return int(n)


@dataclass(frozen=True, slots=True)
class PeakBatch:
    """The profile batch: prompt lengths that fill one step's token budget and its sequence limit."""
    prompt_lengths: tuple[int, ...]

    @classmethod
    def for_limits(cls, max_num_batched_tokens: int, max_running_requests: int, max_context: int) -> PeakBatch:
        seqs = max(1, min(max_running_requests, max_num_batched_tokens))
        each = max(1, min(max_num_batched_tokens // seqs, max_context - 1))
        return cls((each,) * seqs)

    def blocks_needed(self, block_size: int) -> int:
        return sum(-(-(n + 1) // block_size) for n in self.prompt_lengths)
