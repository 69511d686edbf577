"""LLMEngine: the node's step loop (schedule -> run -> update) over one model and one KV pool."""
from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from raypd.engine.cache.block_allocator import BlockAllocator
from raypd.engine.cache.host_kv_tier import HostKVTier
from raypd.engine.cache.kv_cache import PagedKVCache
from raypd.engine.cache.kv_event_log import KVEventLog
from raypd.engine.cache.kv_tier import DiskKVTier
from raypd.engine.cache.kv_tiers import BlockTier, KVTiers
from raypd.engine.cache.radix_cache import RadixCache
from raypd.engine.config import EngineConfig
from raypd.engine.device import batch_defaults, configure_math, resolve_device, resolve_dtype
from raypd.engine.errors import ConfigError, InvalidRequestError
from raypd.engine.gpu.backend import GPU_BACKENDS, choose_backend
from raypd.engine.gpu.cuda_graphs import CudaGraphFactory, DecodeGraphs
from raypd.engine.gpu.flashinfer_attention import FlashInferAttention
from raypd.engine.gpu.runner import CudaModelRunner
from raypd.engine.kv_memory import (
    DEFAULT_CPU_KV_MB,
    CudaMemory,
    DeviceMemory,
    MemoryReading,
    PeakBatch,
    blocks_for_bytes,
    check_free_at_start,
    gpu_kv_bytes,
    torch_decode_gather_bytes,
)
from raypd.engine.model import native_attention
from raypd.engine.model.attention import paged_attention
from raypd.engine.model.config import ModelConfig
from raypd.engine.model.linear import LinearFactory, choose_linears
from raypd.engine.model.llama import TORCH_LAYER_OPS, Attention, LayerOps, LlamaModel
from raypd.engine.model.native_attention import KernelUnavailable, NativeDecodeAttention
from raypd.engine.model.source import resolve_model
from raypd.engine.model.weights import load_weights
from raypd.engine.model_runner import ModelRunner
from raypd.engine.outputs import BlockAccounting, StepOutput
from raypd.engine.overlap import PENDING, LaunchedDecode
from raypd.engine.request import Request, RequestStatus
from raypd.engine.sampler import Sampler
from raypd.engine.scheduler import FairKey, ScheduledBatch, Scheduler, SchedulerConfig
from raypd.protocol.kv_events import KVEventCallback
from raypd.protocol.queued_by_priority import QueuedByPriority
from raypd.protocol.sampling_params import SamplingParams

log = logging.getLogger(__name__)
# Decode steps whose longest context is past this run eagerly: the graphs' block tables are this wide.
GRAPH_MAX_CONTEXT = 8192

@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What a node's load report needs from its engine, as counts (LLMEngine.load())."""
    waiting: int
    running: int
    queued_prefill_tokens: int  # prompt tokens of waiting and running requests not yet computed
    free_blocks: int            # free plus evictable cached blocks: what a new request can get
    cached_blocks: int
    total_blocks: int
    kv_bytes_per_token: int = 0
    tier_load_bytes_per_s: dict[int, float] = field(default_factory=dict)  # KVTier -> measured load rate
    queued_by_priority: QueuedByPriority = ()   # queued_prefill_tokens by priority (Scheduler.queued_prompt_tokens)


class LLMEngine:
    def __init__(self, model: str | None = None, on_kv_event: KVEventCallback | None = None,
                 device_memory: DeviceMemory | None = None, **options):
        """device_memory: what sizes the KV pool by gpu_memory_utilization (CUDA's own by default on
        a GPU; tests pass fixed readings to run that sizing on the CPU)."""
        self.device = resolve_device(options.get("device", "auto"))
        # The caller's options win over the device kind's batch sizes (engine/device.py).
        self.config = cfg = EngineConfig(**(batch_defaults(self.device) | options))
        if cfg.num_threads is not None:
            torch.set_num_threads(cfg.num_threads)
        self.dtype = dtype = resolve_dtype(cfg.dtype, self.device)
        configure_math(self.device, dtype)
        if device_memory is None and self.device.type == "cuda":
            device_memory = CudaMemory(self.device)
        by_utilization = cfg.num_blocks is None and cfg.kv_cache_memory_mb is None and device_memory is not None
        if by_utilization:
            assert device_memory is not None
            device_memory.reset_peak()
            at_start = device_memory.read()
            check_free_at_start(at_start, cfg.gpu_memory_utilization)
        self.model_dir = resolve_model(model)
        self.model_config = mc = ModelConfig.from_folder(self.model_dir)
        weights = load_weights(mc, self.model_dir, dtype, self.device)
        self.backend = choose_backend(cfg.attention_backend, self.device).backend
        ops: LayerOps = TORCH_LAYER_OPS
        attention: Attention = paged_attention
        # FlashInfer plans each step on the host before its forward: the runner calls it (runner.py).
        self._planner: FlashInferAttention | None = None
        if self.backend in GPU_BACKENDS:
            from raypd.engine.gpu.layer_ops import TritonLayerOps  # imports Triton: only on this path
            from raypd.engine.gpu.triton_attention import TritonAttention
            ops = TritonLayerOps()
            if self.backend == "flashinfer":
                attention = self._planner = FlashInferAttention(mc.num_heads, mc.num_kv_heads, mc.head_dim,
                                                                cfg.block_size, dtype, self.device)
            else:
                attention = TritonAttention(mc.head_dim)
        self.model = LlamaModel(mc, weights, self.device, dtype, linears=self._linears(cfg, dtype), ops=ops,
                                attention=attention)
        del weights  # the model keeps what it uses (packed copies replace the projections)
        self.sampler = Sampler(self.device, cfg.seed)
        self.requests: dict[str, Request] = {}
        self.reservations: dict[object, list[int]] = {}  # PD decode: blocks waiting for a transfer
        self.last_step_tokens = 0  # tokens the last step computed (node load reports use it)
        self._left_waiting = 0     # requests the last step's schedule did not admit
        self._ids = itertools.count()
        # Overlap scheduling (engine/overlap.py): the decode step in flight, on the CUDA runner only.
        self._inflight: LaunchedDecode | None = None
        self._overlap = not cfg.disable_overlap_schedule

        per_block = PagedKVCache.bytes_per_block(mc, cfg.block_size, dtype)
        self.kv_bytes_per_token = per_block // cfg.block_size
        if cfg.num_blocks is not None:
            self.num_blocks = cfg.num_blocks
        elif by_utilization:
            assert device_memory is not None
            self.num_blocks = blocks_for_bytes(
                gpu_kv_bytes(at_start, self._profile_peak_batch(device_memory), cfg.gpu_memory_utilization),
                per_block, f"--gpu-memory-utilization {cfg.gpu_memory_utilization}")
        else:
            mb = DEFAULT_CPU_KV_MB if cfg.kv_cache_memory_mb is None else cfg.kv_cache_memory_mb
            self.num_blocks = blocks_for_bytes(mb * 2**20, per_block, f"kv_cache_memory_mb={mb}")
        self._build_pool(self.num_blocks, on_kv_event, tiered=True)
        self._capture_graphs()
        log.info("engine on %s in %s: %d KV blocks of %d tokens (%.0f MiB)", self.device, str(dtype).removeprefix("torch."),
                 self.num_blocks, cfg.block_size, self.num_blocks * per_block / 2**20)

    def _build_tiers(self, events: KVEventLog) -> KVTiers:
        cfg, pool = self.config, self.kv_cache.pool
        tiers: list[BlockTier] = []
        if cfg.kv_host_tier_size_mb > 0:
            tiers.append(HostKVTier(cfg.kv_host_tier_size_mb * 2**20, pool))
        if cfg.kv_tier_dir is not None:
            tiers.append(DiskKVTier(cfg.kv_tier_dir, cfg.kv_tier_size_mb * 2**20, pool))
        log.info("KV tiers below the pool: %s (%s)", ", ".join(t.kind.name.lower() for t in tiers), cfg.kv_tier_policy)
        return KVTiers(pool, tiers, events, cfg.kv_tier_policy, cfg.kv_tier_write_through_hits)

    def _build_pool(self, num_blocks: int, on_kv_event: KVEventCallback | None, tiered: bool = False) -> None:
        """The KV pool and everything that indexes it: allocator, prefix cache (over the KV tier when
        `tiered` and configured: not for the profile's temporary pool), scheduler, runner."""
        cfg, mc = self.config, self.model_config
        self.kv_cache = PagedKVCache(mc, num_blocks, cfg.block_size, self.dtype, self.device)
        self.allocator = BlockAllocator(num_blocks)
        events = KVEventLog(on_kv_event)
        self.kv_tier = self._build_tiers(events) if tiered and cfg.tiered else None
        self.prefix_cache = RadixCache(self.allocator, cfg.block_size, lower=self.kv_tier, events=events)
        self.scheduler = Scheduler(SchedulerConfig(
            block_size=cfg.block_size, max_num_batched_tokens=cfg.max_num_batched_tokens,
            chunked_prefill_size=cfg.chunked_prefill_size, max_running_requests=cfg.max_running_requests,
            schedule_policy=cfg.schedule_policy, enable_prefix_cache=cfg.enable_prefix_cache,
            srpt_aging_tokens_per_s=cfg.srpt_aging_tokens_per_s,
            max_prefill_tokens_per_step=cfg.max_prefill_tokens_per_step,
            yield_step_tokens=cfg.yield_step_tokens, yield_window_s=cfg.yield_window_s,
            init_new_token_ratio=cfg.init_new_token_ratio, min_new_token_ratio=cfg.min_new_token_ratio,
        ), self.allocator, self.prefix_cache)
        self.runner: ModelRunner | CudaModelRunner
        if self.backend in GPU_BACKENDS:
            self.decode_kernel = None
            self.runner = CudaModelRunner(self.model, self.kv_cache, self.sampler, self.device, self._planner)
            if self.device.type == "cuda":  # compiled kernels; the interpreter (tests) has nothing to compile
                self.runner.warm_up()
        else:
            self.decode_kernel = self._decode_kernel(cfg, mc)
            self.runner = ModelRunner(self.model, self.kv_cache, self.sampler, self.device, self.decode_kernel)

    def _capture_graphs(self) -> int:
        """Capture the decode graphs on the current pool (engine/gpu/cuda_graphs.py) when this engine
        uses them; returns the device memory they reserved (0 without graphs)."""
        cfg = self.config
        if self.backend not in GPU_BACKENDS or self.device.type != "cuda" or cfg.enforce_eager:
            return 0
        assert isinstance(self.runner, CudaModelRunner), "graphs run on the CUDA runner"
        context = min(self.model_config.max_position_embeddings, GRAPH_MAX_CONTEXT)
        before = torch.cuda.memory_reserved(self.device)
        with torch.inference_mode():
            self.runner.graphs = DecodeGraphs(self.runner.decode_forward, cfg.max_running_requests,
                                              -(-context // cfg.block_size), self.device, CudaGraphFactory(self.device))
        reserved = torch.cuda.memory_reserved(self.device) - before
        log.info("CUDA graphs for decode batches of %s sequences (contexts up to %d tokens): %.0f MiB",
                 self.runner.graphs.sizes, context, reserved / 2**20)
        return reserved

    def _profile_peak_batch(self, memory: DeviceMemory) -> MemoryReading:
        """Run the largest step this engine will take (engine/kv_memory.py, PeakBatch) on a pool just
        big enough for it, and read the device's memory at its peak. The pool emits no KV events
        (nothing of it is cached afterwards) and is dropped before the real one is made."""
        cfg, mc = self.config, self.model_config
        batch = PeakBatch.for_limits(cfg.max_num_batched_tokens, cfg.max_running_requests, mc.max_position_embeddings)
        self.num_blocks = batch.blocks_needed(cfg.block_size)
        self._build_pool(self.num_blocks, None)
        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        start = 0
        for i, n in enumerate(batch.prompt_lengths):  # distinct tokens: no prefix is shared
            self.add_request([(start + j) % mc.vocab_size for j in range(n)], params, f"profile-{i}")
            start += n
        while self.has_unfinished():
            self.step()
        reading = memory.read()
        for rid in list(self.requests):
            self.abort(rid)
        # The graphs' memory stays reserved beside every later step's activations: count it on top.
        graphs = self._capture_graphs()
        reading = dataclasses.replace(reading, peak_allocated=reading.peak_allocated + graphs)
        if self.backend == "torch" and self.decode_kernel is None:
            # This path gathers every sequence's context for each decode layer: reserve it at full
            # context for max_running_requests (the Triton kernels read blocks in place: nothing).
            context = -(-mc.max_position_embeddings // cfg.block_size) * cfg.block_size
            gather = torch_decode_gather_bytes(cfg.max_running_requests, context, mc.num_heads, mc.num_kv_heads,
                                               mc.head_dim, self.dtype.itemsize)
            reading = dataclasses.replace(reading, peak_allocated=reading.peak_allocated + gather)
        del self.kv_cache, self.kv_tier, self.allocator, self.prefix_cache, self.scheduler, self.runner, self.decode_kernel
        return reading

    def _linears(self, cfg: EngineConfig, dtype: torch.dtype) -> LinearFactory:
        choice = choose_linears(self.device, dtype, cfg.quantization, cfg.cpu_kernels != "torch",
                                cfg.num_threads or torch.get_num_threads())
        if choice.fallback is not None:
            self._fall_back(cfg, "the fast projections", choice.factory.describe(), choice.fallback)
        return choice.factory

    def _decode_kernel(self, cfg: EngineConfig, mc: ModelConfig) -> NativeDecodeAttention | None:
        if cfg.cpu_kernels == "torch":
            return None
        why_not = native_attention.supports(self.kv_cache.pool, mc.num_heads)
        if why_not is None:
            try:
                return NativeDecodeAttention(cfg.num_threads or torch.get_num_threads())
            except KernelUnavailable as e:
                why_not = str(e)
        self._fall_back(cfg, "the decode-attention kernel", "decode attention on the torch path", why_not)
        return None

    @staticmethod
    def _fall_back(cfg: EngineConfig, part: str, instead: str, why_not: str) -> None:
        """A fast path cannot run: an error when the caller asked for it, else a log line."""
        if cfg.cpu_kernels == "native":
            raise ConfigError(f"cpu_kernels='native': {part} unavailable: {why_not}")
        log.info("%s: %s", instead, why_not)

    # -- requests -------------------------------------------------------------------------------
    def add_request(self, prompt_token_ids: Sequence[int], params: SamplingParams,
                    request_id: str | None = None, prefill_only: bool = False) -> str:
        """Queue a request. prefill_only (a PD prefill node): stop after the first sampled token and
        hold the prompt's KV blocks until release(); prefilled_blocks() names them."""
        req = self._new_request(prompt_token_ids, params, request_id, prefill_only)
        req.prefill_only = prefill_only
        self.requests[req.request_id] = req
        self.scheduler.add(req)
        return req.request_id

    def _new_request(self, prompt_token_ids: Sequence[int], params: SamplingParams, request_id: str | None,
                     prefill_only: bool = False) -> Request:
        ids = self.validate(prompt_token_ids, params, prefill_only)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self.requests:
            raise InvalidRequestError(f"duplicate request id {rid!r}", "request_id")
        mc = self.model_config
        stops = set(params.stop_token_ids)
        if not params.ignore_eos:
            stops |= set(mc.eos_token_ids)
        # A prefill-only request produces one token here, whatever max_tokens the decode side honours;
        # counting more would make admission keep headroom for tokens this engine never computes.
        return Request(rid, ids, params, frozenset(stops),
                       max_total_tokens=self._token_limit(len(ids), 1 if prefill_only else params.max_tokens))

    def _token_limit(self, num_prompt_tokens: int, max_tokens: int) -> int:
        """A request's max_total_tokens: prompt + max_tokens, capped at the model's context length."""
        return min(num_prompt_tokens + max_tokens, self.model_config.max_position_embeddings)

    def validate(self, prompt_token_ids: Sequence[int], params: SamplingParams,
                 prefill_only: bool = False) -> list[int]:
        """The checks add_request makes, without adding: InvalidRequestError if this engine could
        never serve the request (bad ids, over the context, more KV blocks than it has); the ids.
        Nodes call it before taking a room, so a bad request fails before any peer waits on it."""
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("params must be a SamplingParams", "params")
        ids = list(prompt_token_ids)
        if not ids:
            raise InvalidRequestError("prompt is empty", "prompt")
        if params.num_replayed_tokens >= len(ids):
            raise InvalidRequestError(f"num_replayed_tokens ({params.num_replayed_tokens}) must be less than the "
                                      f"prompt length ({len(ids)})", "num_replayed_tokens")
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(f"token id {bad[0]!r} is outside the vocabulary [0, {vocab})", "prompt")
        ctx = self.model_config.max_position_embeddings
        if len(ids) >= ctx:
            raise InvalidRequestError(f"prompt has {len(ids)} tokens; the context length is {ctx}", "prompt")
        total = min(len(ids) + (1 if prefill_only else params.max_tokens), ctx)
        need = -(-total // self.config.block_size)
        if need > self.num_blocks:
            raise InvalidRequestError(
                f"request needs {need} KV blocks ({total} tokens) but the cache holds only {self.num_blocks}",
                "max_tokens")
        return ids

    # -- PD: the prefill side ---------------------------------------------------------------------
    def prefilled_blocks(self, request_id: str) -> list[int]:
        """The blocks holding a PREFILLED request's prompt KV, in prompt order."""
        req = self._require(request_id, RequestStatus.PREFILLED)
        return req.block_table[:-(-req.num_prompt_tokens // self.config.block_size)]

    def release(self, request_id: str) -> None:
        """Let go of a PREFILLED request: its full prompt blocks stay in the prefix cache."""
        req = self._require(request_id, RequestStatus.PREFILLED)
        self.scheduler.finish(req, RequestStatus.FINISHED_STOPPED)
        self.sampler.release(request_id)
        del self.requests[request_id]

    # -- PD: the decode side ----------------------------------------------------------------------
    def reserve(self, key: object, num_prompt_tokens: int) -> list[int] | None:
        """Take blocks for an incoming prompt's KV, or None while that would eat into the decode
        headroom of the running requests (the caller retries later: back-pressure)."""
        if key in self.reservations:
            raise InvalidRequestError(f"reservation {key!r} exists", "request_id")
        need = -(-num_prompt_tokens // self.config.block_size)
        if need > self.num_blocks:
            raise InvalidRequestError(f"prompt needs {need} KV blocks; the cache holds {self.num_blocks}", "prompt")
        if not self.scheduler.can_reserve(need):
            return None
        blocks = self.allocator.allocate(need)
        self.reservations[key] = blocks
        return list(blocks)

    def unreserve(self, key: object) -> None:
        blocks = self.reservations.pop(key, None)
        if blocks is not None:
            self.allocator.decref(blocks)

    def add_prefilled(self, key: object, prompt_token_ids: Sequence[int], first_token: int, params: SamplingParams,
                      request_id: str, num_cached_tokens: int = 0) -> StepOutput:
        """Start decoding a request whose prompt KV arrived in reservation `key` and whose first token
        the prefill node sampled. Returns that token as the request's first output (maybe final)."""
        if key not in self.reservations:
            raise InvalidRequestError(f"no reservation {key!r}", "request_id")
        req = self._new_request(prompt_token_ids, params, request_id)
        if not (isinstance(first_token, int) and 0 <= first_token < self.model_config.vocab_size):
            raise InvalidRequestError(f"first token {first_token!r} is outside the vocabulary", "first_token")
        if len(self.reservations[key]) != -(-req.num_prompt_tokens // self.config.block_size):
            raise InvalidRequestError(f"reservation {key!r} does not fit a {req.num_prompt_tokens}-token prompt",
                                      "prompt")
        req.block_table = self.reservations.pop(key)
        req.num_computed_tokens = req.num_prompt_tokens
        req.num_cached_tokens = num_cached_tokens
        req.token_ids.append(first_token)  # the prefill node drew it; this engine draws the next position
        self.requests[request_id] = req
        self.scheduler.add_running(req)
        return self._emit(req, first_token)

    def _require(self, request_id: str, status: RequestStatus) -> Request:
        req = self.requests.get(request_id)
        if req is None or req.status != status:
            raise InvalidRequestError(f"no {status.name} request {request_id!r}", "request_id")
        return req

    def abort(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is not None:
            inflight = self._inflight
            if inflight is not None and inflight.done is not None and any(x.request is req for x in inflight.items):
                # Its blocks may be handed to a KV transfer next, which no CUDA stream orders after
                # the step still writing them: let that step finish first.
                inflight.done.synchronize()
            self.scheduler.abort(req)
            self.sampler.release(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the loop -------------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        """Schedule, run, update: the outputs of one step. On the CUDA runner, with overlap
        scheduling, the outputs of the previous step while the next one runs (_step_overlapped)."""
        if self._overlap and isinstance(self.runner, CudaModelRunner):
            return self._step_overlapped(self.runner)
        return self._run(self._schedule())

    def _schedule(self) -> ScheduledBatch:
        batch = self.scheduler.schedule()
        self.last_step_tokens = batch.num_tokens
        self._left_waiting = len(self.scheduler.waiting)
        return batch

    def _run(self, batch: ScheduledBatch) -> list[StepOutput]:
        if not batch:
            return []
        sampled = self.runner.run(batch)
        self.scheduler.update(batch)
        outputs = []
        for item, token in zip(batch.items, sampled):
            if token is None:
                continue
            req = item.request
            req.token_ids.append(token)
            outputs.append(self._emit(req, token))
        return outputs

    def _step_overlapped(self, runner: CudaModelRunner) -> list[StepOutput]:
        """step() one decode step ahead of the host (engine/overlap.py, where the order is drawn)."""
        outputs: list[StepOutput] = []
        inflight = self._inflight
        if inflight is not None and any(x.start + 2 >= x.request.max_total_tokens for x in inflight.items):
            outputs, inflight = self._collect(runner, inflight), None  # a request ends by length: compute nothing past it
        batch = self._schedule()
        if batch and runner.can_launch_ahead(batch.items):
            self._inflight = runner.launch_ahead(batch.items, inflight)
            self.scheduler.update(batch)
            for x in batch.items:
                x.request.token_ids.append(PENDING)
            return outputs + (self._collect(runner, inflight) if inflight is not None else [])
        self._inflight = None
        if inflight is not None:
            outputs += self._collect(runner, inflight)
            batch.items = [x for x in batch.items if not x.request.status.is_finished]  # ended by the collect
        return outputs + self._run(batch)

    def _collect(self, runner: CudaModelRunner, launched: LaunchedDecode) -> list[StepOutput]:
        """Wait for a launched decode step's tokens, put each in place of its PENDING, emit them."""
        outputs = []
        for item, token in zip(launched.items, runner.collect(launched)):
            req = item.request
            if req.status.is_finished:  # aborted, or ended by the step before: its token is dropped
                continue
            req.token_ids[item.start + 1] = token
            outputs.append(self._emit(req, token, item.start + 2))
        return outputs

    def _emit(self, req: Request, token: int, num_tokens: int | None = None) -> StepOutput:
        """num_tokens: the request's tokens up to this one (default: all it has; with overlap
        scheduling a PENDING one may follow, dropped if this one ends the request)."""
        if req.prefill_only:
            self.scheduler.hold(req)
            return StepOutput(req.request_id, [token], True, "prefilled", req.num_cached_tokens or 0)
        count = req.num_tokens if num_tokens is None else num_tokens
        status = self._stop_status(req, token, req.max_total_tokens, count)
        if status is None:  # most tokens: the request goes on
            return StepOutput(req.request_id, [token], False, None, req.num_cached_tokens or 0)
        del req.token_ids[count:]
        self.scheduler.finish(req, status)
        self.sampler.release(req.request_id)
        del self.requests[req.request_id]
        return StepOutput(req.request_id, [token], req.status.is_finished, req.status.finish_reason,
                          req.num_cached_tokens or 0)

    def ends_with(self, request_id: str, token: int) -> bool:
        """Whether `token`, the request's latest, ends it as its decode side will judge: a stop token,
        or max_tokens reached (a prefill-only request's own limit is one token, whatever max_tokens
        says). A prefill node asks of the first token it holds: the decode node will end the request with it."""
        req = self.requests[request_id]
        limit = self._token_limit(req.num_prompt_tokens, req.params.max_tokens)
        return self._stop_status(req, token, limit, req.num_tokens) is not None

    @staticmethod
    def _stop_status(req: Request, token: int, max_total_tokens: int, num_tokens: int) -> RequestStatus | None:
        """The one stop check: how `token`, the request's latest of num_tokens, ends it within
        `max_total_tokens` (its own limit when it runs here; ends_with passes the limit its decode
        side will judge by)."""
        if token in req.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if num_tokens >= max_total_tokens:
            return RequestStatus.FINISHED_LENGTH
        return None

    # -- introspection --------------------------------------------------------------------------
    def load(self) -> EngineLoad:
        sched = self.scheduler
        by_priority = sched.queued_prompt_tokens()
        return EngineLoad(len(sched.waiting), len(sched.running), sum(t for _, t in by_priority),
                          self.allocator.num_free + self.prefix_cache.num_evictable_blocks,
                          self.prefix_cache.num_cached_blocks, self.num_blocks,
                          kv_bytes_per_token=self.kv_bytes_per_token,
                          tier_load_bytes_per_s=self.kv_tier.load_rates() if self.kv_tier is not None else {},
                          queued_by_priority=by_priority)

    def num_backlogged(self) -> int:
        """Requests the last step left waiting (no running slot or no memory for them) that still
        wait: what a node's max_waiting_requests bounds. Requests added since are not counted: the
        next step may admit them all, so a burst the engine can take is not refused."""
        return min(self._left_waiting, len(self.scheduler.waiting))

    def displaced_by(self, params: SamplingParams, owned: Container[str],
                     outside: Sequence[tuple[str, SamplingParams]] = ()) -> str | None:
        """At the node's waiting bound: the waiting request a new one with `params` takes the place of,
        or None to refuse the new one (Scheduler.displaced_by has the rule). The caller ends the one
        named (abort(): it holds nothing) as refused for capacity."""
        return self.scheduler.displaced_by(params, owned, outside)

    def waiting_key(self, outside: Iterable[SamplingParams] = ()) -> Callable[[SamplingParams], FairKey]:
        """The waiting queue's rank by params (Scheduler.waiting_key), for a node's queue in front of it."""
        return self.scheduler.waiting_key(outside)

    def block_accounting(self) -> BlockAccounting:
        cached = self.prefix_cache.cached_blocks()
        held = {b for r in self.requests.values() for b in r.block_table} - cached
        held |= {b for blocks in self.reservations.values() for b in blocks}
        return BlockAccounting(total=self.num_blocks, free=self.allocator.num_free, cached=len(cached), held=len(held))

    def stats(self) -> dict:
        acc = self.block_accounting()
        return {"num_blocks": acc.total, "free_blocks": acc.free, "cached_blocks": acc.cached,
                "held_blocks": acc.held, "waiting": len(self.scheduler.waiting),
                "running": len(self.scheduler.running), "reservations": len(self.reservations),
                **self.totals()}

    def totals(self) -> dict:
        """The running totals of stats(), cheap to read (no walk of the cache): what metrics count."""
        return {"num_retractions": self.scheduler.num_retractions, "num_preemptions": self.scheduler.num_preemptions,
                "num_evicted_blocks": self.prefix_cache.num_evicted_blocks,
                **(self.kv_tier.stats() if self.kv_tier is not None else {})}

    def check_block_integrity(self) -> None:
        """Raise AssertionError unless every block's reference count is exactly explained: one
        reference from the prefix cache if it stores the block, one per request block table, one
        per reservation."""
        expected = [0] * self.num_blocks
        for b in self.prefix_cache.cached_blocks():
            expected[b] += 1
        for blocks in [r.block_table for r in self.requests.values()] + list(self.reservations.values()):
            for b in blocks:
                expected[b] += 1
        actual = [self.allocator.ref_count(b) for b in range(self.num_blocks)]
        wrong = [(b, e, a) for b, (e, a) in enumerate(zip(expected, actual)) if e != a]
        assert not wrong, f"block refcounts (block, expected, actual): {wrong[:10]}"
        assert self.allocator.num_free == actual.count(0), "free list disagrees with refcounts"
        assert self.block_accounting().balanced, self.block_accounting()
