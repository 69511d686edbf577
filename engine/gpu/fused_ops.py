"""Fused elementwise kernels for a decoder layer on the GPU (Triton).

An eager decoder layer launches ~15 small torch kernels for its norms, residual adds, rotary and
activation, each reading and writing the whole activation once more. Each kernel here does one such
group in a single launch, reading its inputs once:

- rms_norm:      RMSNorm of each row (cast to float32, mean of squares, rsqrt, cast back, weight).
- add_rms_norm:  the sublayer's residual add, written back in place, then the next RMSNorm.
- silu_and_mul:  SwiGLU's silu(gate) * up straight from the fused gate_up projection (no chunks).
- rotary_qk:     the rotate-half rotary on q and k heads together, in place, cos/sin gathered from the
                 table by position; for Qwen3 each head's RMSNorm (q_norm/k_norm) first.

Exactness: each kernel computes in float32 and rounds to the tensor's dtype exactly where the torch
reference (engine/model/llama.py, rope.py) rounds (the _round calls), so bfloat16/float16 results
equal torch's bit for bit (measured on an H200), except after an RMSNorm: the squares are summed in
another order than torch's, so a normalised value can round 1 ulp apart (a few elements in 10^5),
and the weight multiply can make that 2. The division and exp in silu are IEEE div.rn and
libdevice's expf, as in torch's CUDA kernel (Triton's `/` and tl.exp are faster approximations),
and FMA contraction is off, so float32 matches torch's separate multiply and add too.

CUDA graphs: grids and block sizes come from shapes only, and nothing synchronises with the host.
Positions must lie in [0, len(table)); they are not checked (that would need a synchronisation).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

# Under TRITON_INTERPRET=1 (tests on a machine without a GPU) libdevice has no implementation: the
# kernels then use tl.exp, which the interpreter computes with numpy's exp.
_LIBDEVICE = not triton.knobs.runtime.interpret
_MAX_ROW = 65536        # widest row normalised in registers by one program
_SILU_BLOCK = 1024      # columns per silu_and_mul program: 8 per thread at 4 warps (16-byte loads)
_ROTARY_ELEMENTS = 1024  # heads x half-head elements per rotary program
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _round(x, DTYPE: tl.constexpr):
    """float32 -> DTYPE -> float32: where torch would store an intermediate result in DTYPE."""
    return x.to(DTYPE).to(tl.float32)


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, n, inv_n, eps, x_stride, res_stride, out_stride,
                     ADD: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # 64-bit: row * stride can pass 2^31 in long prefills
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if ADD:
        # residual + x rounded as torch's `residual + x`, stored back: the stream the next sublayer
        # adds to; the norm then reads the rounded sum, as the reference does.
        res_ptrs = res_ptr + row * res_stride + cols
        x = _round(tl.load(res_ptrs, mask=mask, other=0.0).to(tl.float32) + x, res_ptr.dtype.element_ty)
        tl.store(res_ptrs, x, mask=mask)
    # mean as torch's CUDA reduction takes it (sum * 1/n); masked columns are 0 and add nothing.
    r = tl.rsqrt(tl.sum(x * x, axis=0) * inv_n + eps)
    normed = _round(x * r, x_ptr.dtype.element_ty)  # xf.to(x.dtype), before the weight
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, w * normed, mask=mask)  # the store rounds weight * x


@triton.jit
def _silu_and_mul_kernel(gu_ptr, out_ptr, inter, gu_stride, out_stride,
                         LIBDEVICE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate_ptrs = gu_ptr + row * gu_stride + cols
    gate = tl.load(gate_ptrs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_ptrs + inter, mask=mask, other=0.0).to(tl.float32)
    if LIBDEVICE:
        e = libdevice.exp(-gate)
    else:
        e = tl.exp(-gate)
    # F.silu rounds its result to the dtype; the multiply by up is torch's second op.
    silu = _round(tl.math.div_rn(gate, 1.0 + e), out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * out_stride + cols, silu * up, mask=mask)


@triton.jit
def _rotary_kernel(qk_ptr, pos_ptr, cos_ptr, sin_ptr, w_ptr, heads, half, inv_d, eps,
                   row_stride, head_stride, table_stride,
                   NORM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)[:, None]
    col = tl.arange(0, BLOCK_HALF)[None, :]
    col_mask = col < half
    mask = (head < heads) & col_mask
    dtype = qk_ptr.dtype.element_ty
    # Each head as its two halves: rotate_half pairs element i with element i + D/2.
    first = qk_ptr + token * row_stride + head * head_stride + col
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + half, mask=mask, other=0.0).to(tl.float32)
    if NORM:
        # Qwen3: rms_norm over the head's D values with its own weight row, rounded as the reference.
        r = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1))[:, None] * inv_d + eps)
        w1 = tl.load(w_ptr + head * (2 * half) + col, mask=mask, other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + head * (2 * half) + half + col, mask=mask, other=0.0).to(tl.float32)
        x1 = _round(w1 * _round(x1 * r, dtype), dtype)
        x2 = _round(w2 * _round(x2 * r, dtype), dtype)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    cos_row = cos_ptr + pos * table_stride + col
    sin_row = sin_ptr + pos * table_stride + col
    cos1 = tl.load(cos_row, mask=col_mask, other=0.0).to(tl.float32)
    cos2 = tl.load(cos_row + half, mask=col_mask, other=0.0).to(tl.float32)
    sin1 = tl.load(sin_row, mask=col_mask, other=0.0).to(tl.float32)
    sin2 = tl.load(sin_row + half, mask=col_mask, other=0.0).to(tl.float32)
    # x * cos + cat(-x2, x1) * sin: torch rounds each product, and the store rounds the sum.
    tl.store(first, _round(x1 * cos1, dtype) + _round(-x2 * sin1, dtype), mask=mask)
    tl.store(first + half, _round(x2 * cos2, dtype) + _round(x1 * sin2, dtype), mask=mask)


def _warps(elements: int, per_warp: int = 256) -> int:
    """1 to 16 warps, per_warp elements each (256: 8 per thread, one 16-byte load of bfloat16)."""
    return min(max(elements // per_warp, 1), 16)


def _check_rows(name: str, t: torch.Tensor, dims: int = 2) -> None:
    if t.dim() != dims:
        raise ValueError(f"{name} must be {dims}-D, got shape {tuple(t.shape)}")
    if t.dtype not in _FLOATS:
        raise ValueError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
    if t.stride(-1) != 1:
        raise ValueError(f"{name}'s last dimension must be contiguous, got strides {t.stride()}")


def _check_weight(weight: torch.Tensor, shape: tuple[int, ...], x: torch.Tensor) -> None:
    if tuple(weight.shape) != shape or not weight.is_contiguous():
        raise ValueError(f"weight must be contiguous of shape {shape}, got {tuple(weight.shape)}")
    if weight.dtype not in _FLOATS or weight.device != x.device:
        raise ValueError(f"weight must be a float tensor on {x.device}, got {weight.dtype} on {weight.device}")


def _norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _check_rows("x", x)
    rows, n = x.shape
    _check_weight(weight, (n,), x)
    if n > _MAX_ROW:
        raise ValueError(f"rows of {n} values are wider than the {_MAX_ROW} one program normalises")
    res = x if residual is None else residual
    if residual is not None:
        _check_rows("residual", residual)
        if residual.shape != x.shape or residual.dtype != x.dtype or residual.device != x.device:
            raise ValueError(f"residual must match x ({tuple(x.shape)}, {x.dtype}, {x.device}), got "
                             f"{tuple(residual.shape)}, {residual.dtype}, {residual.device}")
    # weight * x.to(dtype) promotes as torch does (a float32 weight gives a float32 result).
    out = torch.empty((rows, n), dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if rows:
        # 16 elements a thread: a few percent faster than 8 on an H200, for 64 rows and for 4096.
        block = triton.next_power_of_2(n)
        _rms_norm_kernel[(rows,)](x, res, weight, out, n, 1.0 / n, eps, x.stride(0), res.stride(0), out.stride(0),
                                  ADD=residual is not None, BLOCK=block, num_warps=_warps(block, 512),
                                  enable_fp_fusion=False)
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [T, N] (rows may be strided), weight: [N]. A new [T, N] tensor: llama.rms_norm(x, weight, eps)."""
    return _norm(x, None, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """residual += x in place (rounded as torch's `residual + x`), then a new tensor
    rms_norm(residual, weight, eps). One launch. x and residual: [T, N] of one dtype."""
    return _norm(x, residual, weight, eps)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [T, 2I] -> a new [T, I] = silu(gate_up[:, :I]) * gate_up[:, I:], rounded as torch's two ops."""
    _check_rows("gate_up", gate_up)
    rows, width = gate_up.shape
    if width % 2:
        raise ValueError(f"gate_up's width must be even (gate then up), got {width}")
    inter = width // 2
    out = torch.empty((rows, inter), dtype=gate_up.dtype, device=gate_up.device)
    if rows and inter:
        block = min(triton.next_power_of_2(inter), _SILU_BLOCK)
        _silu_and_mul_kernel[(rows, triton.cdiv(inter, block))](
            gate_up, out, inter, gate_up.stride(0), out.stride(0), LIBDEVICE=_LIBDEVICE, BLOCK=block,
            num_warps=_warps(block), enable_fp_fusion=False)
    return out


def rotary_qk(qk: torch.Tensor, positions: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor,
              norm_weight: torch.Tensor | None = None, eps: float = 0.0) -> None:
    """In place on qk: [T, heads, D] (rows may be strided, as a view of the qkv projection's output;
    each row's heads and D contiguous) with positions [T] (int32/int64) into cos_table/sin_table
    [max_pos, D] of qk's dtype (rope.RotaryTable.cos/.sin). With norm_weight [heads, D], each head
    is first RMS-normalised with its weight row (Qwen3's q_norm/k_norm stacked). One launch."""
    _check_rows("qk", qk, dims=3)
    tokens, heads, dim = qk.shape
    if dim % 2:
        raise ValueError(f"qk's head dimension must be even (rotate-half pairs), got shape {tuple(qk.shape)}")
    if positions.shape != (tokens,) or positions.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"positions must be int32/int64 of shape ({tokens},), got {positions.dtype} "
                         f"{tuple(positions.shape)}")
    for name, table in (("cos_table", cos_table), ("sin_table", sin_table)):
        _check_rows(name, table)
        if table.shape[1] != dim or table.dtype != qk.dtype or table.device != qk.device:
            raise ValueError(f"{name} must be [max_pos, {dim}] of {qk.dtype} on {qk.device}, got "
                             f"{tuple(table.shape)} of {table.dtype} on {table.device}")
    if cos_table.stride(0) != sin_table.stride(0):
        raise ValueError("cos_table and sin_table must have the same row stride")
    if positions.device != qk.device:
        raise ValueError(f"positions must be on {qk.device}, got {positions.device}")
    if norm_weight is not None:
        _check_weight(norm_weight, (heads, dim), qk)
        if norm_weight.dtype != qk.dtype:  # the norm's result must stay in qk's dtype to be in place
            raise ValueError(f"norm_weight must be {qk.dtype} like qk, got {norm_weight.dtype}")
    if not tokens or not heads:
        return
    half = dim // 2
    block_half = triton.next_power_of_2(half)
    block_h = min(triton.next_power_of_2(heads), max(_ROTARY_ELEMENTS // block_half, 1))
    _rotary_kernel[(tokens, triton.cdiv(heads, block_h))](
        qk, positions, cos_table, sin_table, qk if norm_weight is None else norm_weight, heads, half,
        1.0 / dim, eps, qk.stride(0), qk.stride(1), cos_table.stride(0), NORM=norm_weight is not None,
        BLOCK_H=block_h, BLOCK_HALF=block_half, num_warps=_warps(block_h * block_half), enable_fp_fusion=False)
