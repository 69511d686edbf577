"""Triton kernels for attention over the paged KV pool: write_kv, decode_attention, prefill_attention.

The KV cache is one pool tensor per engine:

    pool[num_blocks, num_layers, 2, kv_heads, block_size, head_dim]     (index 2: 0 = K, 1 = V)

A request's token at position p lives in block table[p // block_size], slot p % block_size. The kernels
address the pool through pool.stride(...) only, and gather block ids per token (one table load per
key row), so a tile of BLOCK_N keys may span several blocks and any block size works.

Decode (one query per sequence) is split-K flash-decoding, in two launches:

    stage 1, grid (B, KVH, NS)  the G = H // KVH query heads of one KV head are the rows of one tile
                                (padded to >= 16 rows for tl.dot); split s attends to the keys
                                [s * span, min((s + 1) * span, ctx)) and writes its normalized partial
                                output and its log2-sum-exp; a split past the context writes nothing.
    stage 2, grid (B, H)        merges the splits that stage 1 wrote: out = sum_s w_s o_s / sum_s w_s,
                                w_s = 2^(lse_s - max lse); a row with ctx_len 0 gets zeros.

    span = cdiv(cdiv(ctx_len, NS), BLOCK_N) * BLOCK_N   per sequence, on the device (stage 1 and 2 agree)
    NS   = from shapes only (B, KVH, W * block_size)    enough programs for ~3 waves of the GPU's SMs,
                                                        rounded down to a power of two: each NS is a
                                                        compiled variant, and compile_variants() builds
                                                        every one at engine start (a first use would
                                                        stall its step for the compile, 0.3-1 s)

Nothing in a wrapper reads a tensor's values, so decode_attention and write_kv can be captured in a CUDA
graph. Prefill is a varlen causal flash-attention forward over the block tables, grid (query tiles,
sequences, KVH). A tile's BLOCK_M rows are (query, head) pairs of one KV head, so the G heads share each
K/V tile:

    row r      query i = tile * (BLOCK_M // G) + r // G  (rows cu_q[s] + i of q), head kvh * G + r % G
    position   starts[s] + i: it sees keys 0 .. starts[s] + i  (rows past (BLOCK_M // G) * G are unused)

Key tiles wholly below the tile's first query are attended without a mask, those on the diagonal with
one, and those above the tile's last query are never visited.

Softmax runs in base 2 (exp2, scores pre-multiplied by scale * log2(e)) with float32 accumulation.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634
_DECODE_BLOCK_N = 64  # keys per stage-1 iteration: 4 blocks of 16, 2 of 32
_DECODE_WAVES = 3  # stage-1 programs wanted per SM when the batch alone is too small to fill the GPU
_MAX_SPLITS = 64
_DEFAULT_SMS = 132  # an H100/H200, for the split count when the pool is not on a GPU (the interpreter)


def _check_pool(pool: torch.Tensor, layer: int) -> None:
    if pool.dim() != 6 or pool.shape[2] != 2:
        raise ValueError(f"pool must be [num_blocks, num_layers, 2, kv_heads, block_size, head_dim], "
                         f"got {tuple(pool.shape)}")
    if pool.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"pool dtype must be float32, bfloat16 or float16, got {pool.dtype}")
    if not 0 <= layer < pool.shape[1]:
        raise ValueError(f"layer {layer} is out of range for a pool of {pool.shape[1]} layers")


def _check(name: str, t: torch.Tensor, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...],
           device: torch.device) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} must be {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, the pool on {device}")


def _output(out: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor:
    if out is None:
        return torch.empty_like(q, memory_format=torch.contiguous_format)
    _check("out", out, tuple(q.shape), (q.dtype,), q.device)
    return out


def _dot_precision(dtype: torch.dtype) -> str:
    # float32 inputs would otherwise be rounded to TF32 on the tensor cores; 16-bit ones are exact anyway.
    return "ieee" if dtype == torch.float32 else "tf32"


def _sm_count(device: torch.device) -> int:
    return _cuda_sm_count(device.index) if device.type == "cuda" else _DEFAULT_SMS


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int | None) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _num_splits(batch: int, kv_heads: int, max_tokens: int, device: torch.device) -> int:
    """Stage-1 splits per (sequence, KV head), from shapes only: ~3 waves of programs for small batches,
    one split once the batch fills the GPU, never more than the longest context has key tiles."""
    wanted = triton.cdiv(_DECODE_WAVES * _sm_count(device), max(batch * kv_heads, 1))
    n = max(1, min(wanted, triton.cdiv(max_tokens, _DECODE_BLOCK_N), _MAX_SPLITS))
    return 1 << (n.bit_length() - 1)


def split_variants() -> list[int]:
    """Every split count decode_attention can choose."""
    return [1 << i for i in range(_MAX_SPLITS.bit_length())]


def write_kv(pool: torch.Tensor, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    """Write k, v [T, KVH, D] of `layer` into the pool at slots [T] (block * block_size + offset); a
    negative slot skips its token. One launch, no host synchronization."""
    _check_pool(pool, layer)
    kvh, block_size, d = pool.shape[3], pool.shape[4], pool.shape[5]
    t = k.shape[0]
    _check("k", k, (t, kvh, d), (pool.dtype,), pool.device)
    _check("v", v, (t, kvh, d), (pool.dtype,), pool.device)
    _check("slots", slots, (t,), (torch.int32, torch.int64), pool.device)
    if t == 0:
        return
    sp = pool.stride()
    _write_kv_kernel[(t,)](
        k, v, slots, pool, layer * sp[1], *k.stride(), *v.stride(), sp[0], sp[2], sp[3], sp[4], sp[5],
        KVH=kvh, D=d, BLOCK_SIZE=block_size,
        BLOCK_H=triton.next_power_of_2(kvh), BLOCK_D=triton.next_power_of_2(d), num_warps=4)


def decode_attention(q: torch.Tensor, pool: torch.Tensor, layer: int, block_tables: torch.Tensor,
                     ctx_lens: torch.Tensor, scale: float, out: torch.Tensor | None = None,
                     num_splits: int | None = None) -> torch.Tensor:
    """Attention of one query per sequence, q [B, H, D], over its ctx_lens[b] cached tokens (its own
    included); rows with ctx_len 0 are padding and get zeros. Returns [B, H, D] in q.dtype.
    num_splits: force the split count (compile_variants); None picks it from the shapes."""
    _check_pool(pool, layer)
    kvh, block_size, d = pool.shape[3], pool.shape[4], pool.shape[5]
    if q.dim() != 3 or q.shape[2] != d or q.shape[1] % kvh:
        raise ValueError(f"q must be [B, H, {d}] with H a multiple of {kvh} KV heads, got {tuple(q.shape)}")
    b, h = q.shape[0], q.shape[1]
    _check("q", q, tuple(q.shape), (pool.dtype,), pool.device)
    if block_tables.dim() != 2:
        raise ValueError(f"block_tables must be [B, W], got {tuple(block_tables.shape)}")
    w = block_tables.shape[1]
    _check("block_tables", block_tables, (b, w), (torch.int32, torch.int64), pool.device)
    _check("ctx_lens", ctx_lens, (b,), (torch.int32, torch.int64), pool.device)
    out = _output(out, q)
    if b == 0:
        return out
    g = h // kvh
    splits = _num_splits(b, kvh, w * block_size, pool.device) if num_splits is None else num_splits
    mid_o = torch.empty((b, h, splits, d), dtype=torch.float32, device=q.device)
    mid_lse = torch.empty((b, h, splits), dtype=torch.float32, device=q.device)
    sp = pool.stride()
    block_d = max(16, triton.next_power_of_2(d))
    _decode_split_kernel[(b, kvh, splits)](
        q, pool, block_tables, ctx_lens, mid_o, mid_lse, layer * sp[1], scale * _LOG2E,
        *q.stride(), sp[0], sp[2], sp[3], sp[4], sp[5], block_tables.stride(0), *mid_o.stride()[:3],
        *mid_lse.stride()[:2], G=g, D=d, NUM_SPLITS=splits, BLOCK_SIZE=block_size,
        BLOCK_G=max(16, triton.next_power_of_2(g)), BLOCK_N=_DECODE_BLOCK_N, BLOCK_D=block_d,
        DOT_PRECISION=_dot_precision(q.dtype), num_warps=4, num_stages=2)
    _decode_merge_kernel[(b, h)](
        mid_o, mid_lse, ctx_lens, out, *mid_o.stride()[:3], *mid_lse.stride()[:2], *out.stride(),
        D=d, NUM_SPLITS=splits, BLOCK_S=max(2, triton.next_power_of_2(splits)), BLOCK_N=_DECODE_BLOCK_N,
        BLOCK_D=block_d, num_warps=4)
    return out


def prefill_attention(q: torch.Tensor, pool: torch.Tensor, layer: int, cu_q: torch.Tensor, starts: torch.Tensor,
                      block_tables: torch.Tensor, max_q_len: int, scale: float,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of S flattened chunks of queries q [T, H, D] (rows cu_q[s]:cu_q[s+1], positions
    starts[s] + i) over their sequences' cached keys 0 .. position. Returns [T, H, D] in q.dtype."""
    _check_pool(pool, layer)
    kvh, block_size, d = pool.shape[3], pool.shape[4], pool.shape[5]
    if q.dim() != 3 or q.shape[2] != d or q.shape[1] % kvh:
        raise ValueError(f"q must be [T, H, {d}] with H a multiple of {kvh} KV heads, got {tuple(q.shape)}")
    h = q.shape[1]
    _check("q", q, tuple(q.shape), (pool.dtype,), pool.device)
    if starts.dim() != 1 or block_tables.dim() != 2:
        raise ValueError(f"starts must be [S] and block_tables [S, W], got {tuple(starts.shape)} and "
                         f"{tuple(block_tables.shape)}")
    s = starts.shape[0]
    _check("starts", starts, (s,), (torch.int32, torch.int64), pool.device)
    _check("cu_q", cu_q, (s + 1,), (torch.int32, torch.int64), pool.device)
    _check("block_tables", block_tables, (s, block_tables.shape[1]), (torch.int32, torch.int64), pool.device)
    out = _output(out, q)
    if s == 0 or max_q_len <= 0 or q.shape[0] == 0:
        return out
    g = h // kvh
    wide = q.dtype != torch.float32  # 16-bit tiles are half the bytes: larger tiles fit
    big = wide and d >= 128  # tile sizes measured best on an H200 (bf16, head_dim 64 and 128)
    block_m = max(128 if wide else 64, triton.next_power_of_2(g))
    rows_per_query_tile = block_m // g
    sp = pool.stride()
    _prefill_kernel[(triton.cdiv(max_q_len, rows_per_query_tile), s, kvh)](
        q, pool, block_tables, cu_q, starts, out, layer * sp[1], scale * _LOG2E,
        *q.stride(), sp[0], sp[2], sp[3], sp[4], sp[5], block_tables.stride(0), *out.stride(),
        G=g, D=d, BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_N=128 if big else 64 if wide else 32,
        BLOCK_D=max(16, triton.next_power_of_2(d)), DOT_PRECISION=_dot_precision(q.dtype),
        num_warps=8 if wide else 4, num_stages=3 if big else 2)
    return out


@triton.jit
def _write_kv_kernel(K, V, Slots, Pool, layer_offset, stride_kt, stride_kh, stride_kd, stride_vt, stride_vh,
                     stride_vd, stride_pb, stride_pkv, stride_ph, stride_ps, stride_pd,
                     KVH: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    # One program per token: all its KV heads, K and V, as [BLOCK_H, BLOCK_D] tiles.
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(Slots + t).to(tl.int64)
    keep = slot >= 0  # padding rows of a CUDA-graph batch carry slot -1
    slot = tl.maximum(slot, 0)
    hh = tl.arange(0, BLOCK_H)[:, None]
    dd = tl.arange(0, BLOCK_D)[None, :]
    mask = (hh < KVH) & (dd < D) & keep
    k = tl.load(K + t * stride_kt + hh * stride_kh + dd * stride_kd, mask=mask)
    v = tl.load(V + t * stride_vt + hh * stride_vh + dd * stride_vd, mask=mask)
    dst = (Pool + layer_offset + (slot // BLOCK_SIZE) * stride_pb + (slot % BLOCK_SIZE) * stride_ps
           + hh * stride_ph + dd * stride_pd)
    tl.store(dst, k, mask=mask)
    tl.store(dst + stride_pkv, v, mask=mask)


@triton.jit
def _attend_tile(q, acc, l_i, m_i, K, Table, n, kv_end, last_pos, qk_scale, stride_pb, stride_pkv, stride_ps,
                 stride_pd, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 D: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One online-softmax step over the keys n .. n + BLOCK_N - 1 (those < kv_end loaded, the rest 0).
    Row r may see keys up to last_pos[r] when CAUSAL; without it every loaded key is visible to all rows."""
    offs_n = n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    in_ctx = offs_n < kv_end
    # Block id per key row: the tile may span several blocks, and past the context the table is garbage.
    block = tl.load(Table + offs_n // BLOCK_SIZE, mask=in_ctx, other=0).to(tl.int64)
    row = block * stride_pb + (offs_n % BLOCK_SIZE) * stride_ps
    kt = tl.load(K + row[None, :] + offs_d[:, None] * stride_pd,  # K^T: [BLOCK_D, BLOCK_N]
                 mask=in_ctx[None, :] & (offs_d[:, None] < D), other=0.0)
    s = tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale
    if CAUSAL:
        s = tl.where(offs_n[None, :] <= last_pos[:, None], s, float("-inf"))
    # Every row has seen a visible key by now (the caller's tiles start at or below each row's
    # position), so m_new is finite and exp2 never sees inf - inf.
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    v = tl.load(K + stride_pkv + row[:, None] + offs_d[None, :] * stride_pd,
                mask=in_ctx[:, None] & (offs_d[None, :] < D), other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, l_i * alpha + tl.sum(p, 1), m_new


@triton.jit
def _split_span(ctx, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    # Keys per split, a whole number of tiles so that only a split's last tile needs a mask.
    return tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N


@triton.jit
def _decode_split_kernel(Q, Pool, Tables, CtxLens, MidO, MidLse, layer_offset, qk_scale,
                         stride_qb, stride_qh, stride_qd, stride_pb, stride_pkv, stride_ph, stride_ps, stride_pd,
                         stride_tb, stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
                         G: tl.constexpr, D: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                         BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                         DOT_PRECISION: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(CtxLens + b).to(tl.int32)
    span = _split_span(ctx, NUM_SPLITS, BLOCK_N)
    start = split * span
    end = tl.minimum(start + span, ctx)
    full_end = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N  # tiles wholly inside the context

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    head = kvh * G + offs_g
    row_mask = offs_g < G  # rows G .. BLOCK_G - 1 are zeros, there for tl.dot's 16-row minimum
    q = tl.load(Q + b * stride_qb + head[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=row_mask[:, None] & (offs_d[None, :] < D), other=0.0)
    K = Pool + layer_offset + kvh * stride_ph
    table = Tables + b * stride_tb
    last_pos = tl.zeros([BLOCK_G], dtype=tl.int32) + (end - 1)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    for n in range(start, full_end, BLOCK_N):
        acc, l_i, m_i = _attend_tile(q, acc, l_i, m_i, K, table, n, end, last_pos, qk_scale, stride_pb, stride_pkv,
                                     stride_ps, stride_pd, BLOCK_SIZE, BLOCK_N, BLOCK_D, D, False, DOT_PRECISION)
    for n in range(full_end, end, BLOCK_N):  # the partial last tile, if any: at most one iteration
        acc, l_i, m_i = _attend_tile(q, acc, l_i, m_i, K, table, n, end, last_pos, qk_scale, stride_pb, stride_pkv,
                                     stride_ps, stride_pd, BLOCK_SIZE, BLOCK_N, BLOCK_D, D, True, DOT_PRECISION)

    l_safe = tl.where(l_i > 0, l_i, 1.0)  # an empty split stores nothing, but must not compute 0 / 0 either
    mid = MidO + b * stride_mb + head * stride_mh + split * stride_ms
    store_rows = row_mask & (start < end)
    tl.store(mid[:, None] + offs_d[None, :], acc / l_safe[:, None], mask=store_rows[:, None] & (offs_d[None, :] < D))
    tl.store(MidLse + b * stride_lb + head * stride_lh + split, m_i + tl.log2(l_safe), mask=store_rows)


@triton.jit
def _decode_merge_kernel(MidO, MidLse, CtxLens, Out, stride_mb, stride_mh, stride_ms, stride_lb, stride_lh,
                         stride_ob, stride_oh, stride_od,
                         D: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    ctx = tl.load(CtxLens + b).to(tl.int32)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    # The splits stage 1 wrote: those that start inside the context (none when ctx_len is 0).
    valid = (offs_s < NUM_SPLITS) & (offs_s * _split_span(ctx, NUM_SPLITS, BLOCK_N) < ctx)
    lse = tl.load(MidLse + b * stride_lb + h * stride_lh + offs_s, mask=valid, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # no split written (ctx_len 0): every weight below is 0
    w = tl.exp2(lse - m)  # 0 for the splits not written
    o = tl.load(MidO + b * stride_mb + h * stride_mh + offs_s[:, None] * stride_ms + offs_d[None, :],
                mask=valid[:, None] & (offs_d[None, :] < D), other=0.0)
    total = tl.sum(w, 0)
    res = tl.sum(w[:, None] * o, 0) / tl.where(total > 0, total, 1.0)
    tl.store(Out + b * stride_ob + h * stride_oh + offs_d * stride_od, res.to(Out.dtype.element_ty), mask=offs_d < D)


@triton.jit
def _prefill_kernel(Q, Pool, Tables, CuQ, Starts, Out, layer_offset, qk_scale, stride_qt, stride_qh, stride_qd,
                    stride_pb, stride_pkv, stride_ph, stride_ps, stride_pd, stride_tb, stride_ot, stride_oh, stride_od,
                    G: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr):
    QUERIES: tl.constexpr = BLOCK_M // G  # queries per tile; row r is query r // G, head r % G
    # The last query tiles have the most keys: launch them first so the short ones fill the tail.
    tile = tl.num_programs(0) - 1 - tl.program_id(0)
    seq = tl.program_id(1)
    kvh = tl.program_id(2)
    row0 = tl.load(CuQ + seq).to(tl.int32)
    q_len = tl.load(CuQ + seq + 1).to(tl.int32) - row0
    start = tl.load(Starts + seq).to(tl.int32)

    offs_r = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    qi = tile * QUERIES + offs_r // G
    head = kvh * G + offs_r % G
    row_mask = (offs_r < QUERIES * G) & (qi < q_len)
    d_mask = offs_d[None, :] < D
    q_rows = (row0 + qi).to(tl.int64) * stride_qt
    q = tl.load(Q + q_rows[:, None] + head[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=row_mask[:, None] & d_mask, other=0.0)
    pos = start + qi  # each row's position in its sequence: it sees keys 0 .. pos

    first = start + tile * QUERIES
    kv_end = start + tl.minimum((tile + 1) * QUERIES, q_len)  # one past the tile's last query
    kv_end = tl.where(tile * QUERIES < q_len, kv_end, 0)  # a tile past this chunk's queries does nothing
    diag = tl.minimum(first // BLOCK_N * BLOCK_N, kv_end)  # keys below diag are visible to every row
    K = Pool + layer_offset + kvh * stride_ph
    table = Tables + seq * stride_tb
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for n in range(0, diag, BLOCK_N):
        acc, l_i, m_i = _attend_tile(q, acc, l_i, m_i, K, table, n, kv_end, pos, qk_scale, stride_pb, stride_pkv,
                                     stride_ps, stride_pd, BLOCK_SIZE, BLOCK_N, BLOCK_D, D, False, DOT_PRECISION)
    for n in range(diag, kv_end, BLOCK_N):
        acc, l_i, m_i = _attend_tile(q, acc, l_i, m_i, K, table, n, kv_end, pos, qk_scale, stride_pb, stride_pkv,
                                     stride_ps, stride_pd, BLOCK_SIZE, BLOCK_N, BLOCK_D, D, True, DOT_PRECISION)
    res = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_rows = (row0 + qi).to(tl.int64) * stride_ot
    tl.store(Out + o_rows[:, None] + head[:, None] * stride_oh + offs_d[None, :] * stride_od,
             res.to(Out.dtype.element_ty), mask=row_mask[:, None] & d_mask)


def compile_variants(pool: torch.Tensor, num_heads: int) -> None:
    """Compile every kernel variant a step can launch on this pool, before the first request: one
    decode per split count, one prefill and one K/V write. Nothing is written (every slot is -1) and
    the outputs are dropped. Tables are 16 columns wide: the runner pads every table to a multiple of
    16, so their row stride specializes the same way here as in a step."""
    kvh, d = pool.shape[3], pool.shape[5]
    dev, dt = pool.device, pool.dtype
    q = torch.zeros((1, num_heads, d), dtype=dt, device=dev)
    tables = torch.zeros((1, 16), dtype=torch.int32, device=dev)
    ctx = torch.ones(1, dtype=torch.int32, device=dev)
    for splits in split_variants():
        decode_attention(q, pool, 0, tables, ctx, 1.0, num_splits=splits)
    prefill_attention(q, pool, 0, torch.tensor([0, 1], dtype=torch.int32, device=dev),
                      torch.zeros(1, dtype=torch.int32, device=dev), tables, 1, 1.0)
    kv = torch.zeros((1, kvh, d), dtype=dt, device=dev)
    write_kv(pool, 0, kv, kv, torch.full((1,), -1, dtype=torch.int64, device=dev))
