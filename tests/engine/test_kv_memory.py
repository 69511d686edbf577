"""engine/kv_memory.py: the KV pool's size on CPU (explicit) and by --gpu-memory-utilization, whose
sizing runs for real here (the peak batch goes through the engine) with the device's memory
readings given by the test."""
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from raypd.engine import SamplingParams
from raypd.engine.cache.kv_cache import PagedKVCache
from raypd.engine.engine import LLMEngine
from raypd.engine.errors import ConfigError
from raypd.engine.kv_memory import (
    DEFAULT_CPU_KV_MB,
    GiB,
    MemoryReading,
    PeakBatch,
    blocks_for_bytes,
    check_free_at_start,
    gpu_kv_bytes,
    torch_decode_gather_bytes,
)


def reading(total=80 * GiB, free=79 * GiB, peak=0, reserved=0):
    return MemoryReading(total=total, free=free, peak_allocated=peak, reserved=reserved)


def test_utilization_budget_minus_weights_peak_batch_and_memory_outside_torch():
    start = reading(free=79 * GiB)
    # After loading 16 GiB of weights and a peak batch of 4 GiB, torch reserved 21 GiB, and the
    # device lost 22 GiB: 1 GiB went outside torch (CUDA context, registrations).
    after = reading(free=57 * GiB, peak=20 * GiB, reserved=21 * GiB)
    assert gpu_kv_bytes(start, after, 0.9) == int(80 * GiB * 0.9) - 20 * GiB - 1 * GiB


def test_no_room_for_kv_is_a_config_error_that_names_the_flag():
    with pytest.raises(ConfigError, match="gpu-memory-utilization 0.2"):
        gpu_kv_bytes(reading(), reading(free=60 * GiB, peak=18 * GiB, reserved=19 * GiB), 0.2)


def test_start_refuses_when_another_process_holds_the_promised_memory():
    check_free_at_start(reading(free=73 * GiB), 0.9)  # 72 GiB promised, 73 free: fine
    with pytest.raises(ConfigError, match="another process"):
        check_free_at_start(reading(free=40 * GiB), 0.9)


def test_peak_batch_fills_the_token_budget_over_the_sequence_limit():
    batch = PeakBatch.for_limits(8192, 256, 32768)
    assert len(batch.prompt_lengths) == 256 and sum(batch.prompt_lengths) == 8192
    assert PeakBatch.for_limits(16, 64, 2048).prompt_lengths == (1,) * 16  # never more rows than tokens
    assert PeakBatch.for_limits(4096, 1, 512).prompt_lengths == (511,)    # inside the context
    assert PeakBatch((15, 16)).blocks_needed(16) == 1 + 2


def test_blocks_for_bytes():
    assert blocks_for_bytes(10 * 1000, 1000, "x") == 10
    with pytest.raises(ConfigError, match="holds no 1000-byte KV block"):
        blocks_for_bytes(999, 1000, "x")


class GivenMemory:
    """Fixed readings: the device as it was at start, then as it is after the profile batch."""

    def __init__(self, start: MemoryReading, after: MemoryReading):
        self.readings = [start, after]
        self.resets = 0

    def reset_peak(self) -> None:
        self.resets += 1

    def read(self) -> MemoryReading:
        return self.readings.pop(0)


# A 512 MiB device: the readings' arithmetic is the same at any size, and the pool the engine sizes
# from them is allocated in host memory here (126 MiB, where a 4 GiB device's ~1 GiB pools took ~15 s
# an engine to fill on this CPU).
MiB = 2**20
SMALL_GPU = 512 * MiB


def after_profile() -> MemoryReading:
    """The small device after loading and the peak batch: 160 MiB gone, 150 of them reserved by torch."""
    return reading(total=SMALL_GPU, free=SMALL_GPU - 160 * MiB, peak=120 * MiB, reserved=150 * MiB)


def test_the_engine_sizes_its_pool_by_utilization_after_a_real_peak_batch(tiny_model_dir):
    start = reading(total=SMALL_GPU, free=SMALL_GPU)
    after = after_profile()
    memory = GivenMemory(start, after)
    events = []
    engine = LLMEngine(tiny_model_dir, on_kv_event=events.append, device_memory=memory, gpu_memory_utilization=0.5,
                       max_num_batched_tokens=64, max_running_requests=4)
    per_block = PagedKVCache.bytes_per_block(engine.model_config, engine.config.block_size, engine.dtype)
    assert memory.resets == 1 and not memory.readings  # both readings taken: the profile ran to its end
    assert engine.num_blocks == gpu_kv_bytes(start, after, 0.5) // per_block
    assert engine.kv_cache.num_blocks == engine.num_blocks == engine.block_accounting().free
    # Nothing of the profile survives: no requests, no cached prefix, no KV event for the Conductor.
    assert not engine.requests and engine.prefix_cache.num_cached_blocks == 0 and events == []
    out = engine.add_request(list(range(40, 80)), SamplingParams(max_tokens=4, temperature=0.0))
    while engine.has_unfinished():
        engine.step()
    assert out not in engine.requests
    engine.check_block_integrity()


def test_the_torch_paths_decode_gather_at_full_context_is_reserved_before_the_pool(tiny_model_dir):
    """The torch path gathers every sequence's context per decode layer, which the profile batch of
    short prompts never reaches: the pool is sized with that gather at max_running_requests x the
    model's full context taken out. The native kernel reads blocks in place: nothing is taken."""
    start = reading(total=SMALL_GPU, free=SMALL_GPU)

    def sized(**options) -> LLMEngine:
        return LLMEngine(tiny_model_dir, device_memory=GivenMemory(start, after_profile()), gpu_memory_utilization=0.5,
                         max_num_batched_tokens=64, max_running_requests=4, **options)

    gathers, reads_in_place = sized(cpu_kernels="torch"), sized()
    mc = gathers.model_config
    per_block = PagedKVCache.bytes_per_block(mc, gathers.config.block_size, gathers.dtype)
    context = -(-mc.max_position_embeddings // gathers.config.block_size) * gathers.config.block_size
    gather = torch_decode_gather_bytes(4, context, mc.num_heads, mc.num_kv_heads, mc.head_dim, gathers.dtype.itemsize)
    assert gather == 4 * context * (2 * mc.num_kv_heads * mc.head_dim * 4 + mc.num_heads * 4)
    budget = gpu_kv_bytes(start, after_profile(), 0.5)
    assert reads_in_place.num_blocks == budget // per_block
    assert gathers.num_blocks == (budget - gather) // per_block < reads_in_place.num_blocks


def test_explicit_sizes_skip_the_profile(tiny_model_dir):
    memory = GivenMemory(reading(), reading())
    engine = LLMEngine(tiny_model_dir, device_memory=memory, kv_cache_memory_mb=64)
    assert memory.resets == 0 and len(memory.readings) == 2
    per_block = PagedKVCache.bytes_per_block(engine.model_config, engine.config.block_size, torch.float32)
    assert engine.num_blocks == 64 * 2**20 // per_block


def test_cpu_default_is_the_fixed_budget(tiny_model_dir):
    engine = LLMEngine(tiny_model_dir)  # any model: the budget is fixed
    per_block = PagedKVCache.bytes_per_block(engine.model_config, engine.config.block_size, engine.dtype)
    assert engine.num_blocks == DEFAULT_CPU_KV_MB * 2**20 // per_block


def test_memory_outside_torch_is_this_process_own_when_the_driver_reports_it():
    start = reading(free=79 * GiB)
    # Another process allocated 30 GiB between the readings: the device lost 52 GiB, this process
    # 22 GiB (NVML), of which torch reserved 21.
    after = MemoryReading(total=80 * GiB, free=27 * GiB, peak_allocated=20 * GiB, reserved=21 * GiB,
                          process_used=22 * GiB)
    assert gpu_kv_bytes(start, after, 0.4) == int(80 * GiB * 0.4) - 20 * GiB - 1 * GiB


class SharedGpu:
    """One GPU two engines share: each one's readings see the other's memory in `free`, and its own
    in process_used (what NVML reports per process). The weights and peak batch are given numbers
    (on the CPU nothing is allocated on a device); the KV pool is what the engine computed. A 1 GiB
    device, not a real one's size: each engine's pool is allocated in host memory here, and the
    arithmetic is the same at any size (a 16 GiB one spent ~17 s per case filling two 5 GB pools)."""

    total = 1 * GiB
    context = 32 * MiB  # each process's CUDA context, outside torch

    def __init__(self) -> None:
        self.used: dict[str, int] = {}

    def free(self) -> int:
        return self.total - sum(self.used.values())

    def process(self, name: str, weights_and_peak: int, between: Callable[[], None] | None = None) -> ProcessMemory:
        return ProcessMemory(self, name, weights_and_peak, between)


class ProcessMemory:
    def __init__(self, gpu: SharedGpu, name: str, peak: int, between: Callable[[], None] | None):
        self.gpu, self.name, self.peak, self.between = gpu, name, peak, between
        self.reads = 0

    def reset_peak(self) -> None:
        pass

    def read(self) -> MemoryReading:
        self.reads += 1
        if self.reads == 1:  # at start: the context exists, nothing else yet
            self.gpu.used[self.name] = self.gpu.context
        else:  # after the profile: the weights and peak batch are held; then the other engine starts whole
            self.gpu.used[self.name] = self.gpu.context + self.peak
            if self.between is not None:
                self.between()
        return MemoryReading(total=self.gpu.total, free=self.gpu.free(), peak_allocated=self.peak,
                             reserved=self.peak, process_used=self.gpu.used[self.name])

    def took_pool(self, engine: LLMEngine) -> None:
        self.gpu.used[self.name] += engine.num_blocks * PagedKVCache.bytes_per_block(
            engine.model_config, engine.config.block_size, engine.dtype)


WEIGHTS_AND_PEAK = 128 * MiB  # each engine's, as its readings report them


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("second_starts", ["after the first", "during the first's profile"])
def test_two_engines_sharing_a_gpu_both_start_whatever_the_order(tiny_model_dir, dtype, second_starts):
    """Two node actors at --gpu-memory-utilization 0.4 on one GPU (an H200 run failed when the second
    one counted the first's KV pool as its own memory outside torch)."""
    gpu = SharedGpu()
    options = dict(gpu_memory_utilization=0.4, max_num_batched_tokens=64, max_running_requests=4, dtype=dtype)
    engines: dict[str, LLMEngine] = {}

    def start(name: str, between: Callable[[], None] | None = None) -> None:
        memory = gpu.process(name, weights_and_peak=WEIGHTS_AND_PEAK, between=between)
        engines[name] = LLMEngine(tiny_model_dir, device_memory=memory, **options)
        memory.took_pool(engines[name])

    if second_starts == "after the first":
        start("first")
        start("second")
    else:
        start("first", between=lambda: start("second"))
    per_block = PagedKVCache.bytes_per_block(engines["first"].model_config, 16, engines["first"].dtype)
    share = int(gpu.total * 0.4) - WEIGHTS_AND_PEAK - gpu.context  # each one's KV budget: its share less its own use
    assert [e.num_blocks for e in engines.values()] == [share // per_block] * 2
    assert gpu.free() >= 0
