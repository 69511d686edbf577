"""engine/gpu/fused_ops.py against the torch reference it replaces (llama.rms_norm, rope.apply_rotary).

On a GPU: float32, bfloat16 and float16 on "cuda", each result equal to torch's or at most 1 ulp
from it, except where an RMSNorm's weight multiplies a value rounded 1 ulp apart (the kernel adds
the squares in another order than torch): that product can land 2 ulps apart a binade lower. Without
a GPU the kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1): float32,
and float16, whose conversions the interpreter rounds as a GPU does, so the rounding sequence is
checked on CPU too (its float32 -> bfloat16 conversion truncates: bfloat16 runs only on a GPU).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from raypd.engine.gpu import fused_ops
from raypd.engine.model.config import ModelConfig
from raypd.engine.model.llama import rms_norm
from raypd.engine.model.rope import RotaryTable, apply_rotary

if torch.cuda.is_available():
    DEVICE, DTYPES = "cuda", [torch.float32, torch.bfloat16, torch.float16]
else:
    DEVICE, DTYPES = "cpu", [torch.float32, torch.float16]
EPS = 1e-6
MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10}


def assert_matches(got: torch.Tensor, ref: torch.Tensor, ulps: int = 1, scale: torch.Tensor | None = None) -> None:
    """float32: within ~1e-6 of the reference's scale. bfloat16/float16: at most `ulps` apart, in
    ulps of `scale` where given (the size of the terms a sum cancelled) or else of ref, and all but a
    few elements equal (a missed or extra rounding would move a large share of them)."""
    assert got.dtype == ref.dtype and got.shape == ref.shape
    g, r = got.double(), ref.double()
    if ref.dtype == torch.float32:
        torch.testing.assert_close(g, r, rtol=2e-6, atol=2e-6 * ref.abs().max().item())
        return
    finfo = torch.finfo(ref.dtype)
    size = ref.float().abs() if scale is None else torch.maximum(ref.float().abs(), scale.float())
    _, exponent = torch.frexp(size)  # size = m * 2^exponent, m in [0.5, 1)
    # ulp of size in ref's dtype, not below the subnormals' spacing
    ulp = torch.pow(2.0, (exponent - 1 - MANTISSA_BITS[ref.dtype]).double()).clamp(min=finfo.smallest_normal * finfo.eps)
    off = (g - r).abs() / ulp
    assert off.max().item() <= ulps, f"{(off > ulps).sum().item()} elements over {ulps} ulp, worst {off.max():.1f}"
    assert (off > 0).double().mean().item() <= 0.01, f"{(off > 0).sum().item()} of {off.numel()} elements differ"


def weight(n: int, dtype: torch.dtype, *shape: int) -> torch.Tensor:
    return (1 + 0.2 * torch.randn(*shape, n, device=DEVICE)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,n", [(1, 576), (37, 100), (3, 4096)])
def test_rms_norm(dtype, tokens, n):
    torch.manual_seed(0)
    x = (3 * torch.randn(tokens, n, device=DEVICE)).to(dtype)
    w = weight(n, dtype)
    assert_matches(fused_ops.rms_norm(x, w, EPS), rms_norm(x, w, EPS), ulps=2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_strided_rows_and_float32_weight(dtype):
    torch.manual_seed(1)
    wide = torch.randn(5, 300, device=DEVICE).to(dtype)
    x = wide[:, :200]  # rows 300 apart, as h[logits_index] or a slice of a projection
    w = weight(200, torch.float32)  # weight * x.to(dtype) promotes to float32, as in torch
    assert_matches(fused_ops.rms_norm(x, w, EPS), rms_norm(x, w, EPS))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,n", [(1, 576), (37, 100)])
def test_add_rms_norm_updates_the_residual_in_place(dtype, tokens, n):
    torch.manual_seed(2)
    x = torch.randn(tokens, n, device=DEVICE).to(dtype)
    residual = (4 * torch.randn(tokens, n, device=DEVICE)).to(dtype)
    w = weight(n, dtype)
    x_before, h = x.clone(), residual + x
    out = fused_ops.add_rms_norm(x, residual, w, EPS)
    assert torch.equal(residual, h), "the residual must hold residual + x as torch rounds it"
    assert torch.equal(x, x_before)
    assert_matches(out, rms_norm(h, w, EPS), ulps=2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,inter", [(1, 100), (37, 2500)])  # 2500: three column tiles, the last partial
def test_silu_and_mul(dtype, tokens, inter):
    torch.manual_seed(3)
    gate_up = (4 * torch.randn(tokens, 2 * inter, device=DEVICE)).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    # The interpreter's exp is numpy's and torch's CPU exp is Sleef's: they can differ in float32's
    # last bit, and silu then rounds 1 ulp apart, which the multiply by up can make 2. On a GPU both
    # are CUDA's expf.
    assert_matches(fused_ops.silu_and_mul(gate_up), F.silu(gate) * up, ulps=1 if DEVICE == "cuda" else 2)


def rotary_table(head_dim: int, dtype: torch.dtype) -> RotaryTable:
    cfg = ModelConfig.from_hf({"architectures": ["LlamaForCausalLM"], "vocab_size": 16, "hidden_size": 64,
                               "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
                               "head_dim": head_dim, "max_position_embeddings": 4096, "rope_theta": 500000.0})
    return RotaryTable(cfg, torch.device(DEVICE), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,q_heads,kv_heads,head_dim,qk_norm", [
    (37, 32, 8, 64, False),   # 40 heads: two programs of heads per token, the second partly masked
    (1, 4, 2, 80, False),     # half of 80 is no power of two: masked columns
    (37, 4, 2, 128, True),    # Qwen3: each head RMS-normalised with its own weight row first
    (1, 6, 2, 64, True),
])
def test_rotary_qk_in_a_view_of_the_projection(dtype, tokens, q_heads, kv_heads, head_dim, qk_norm):
    torch.manual_seed(4)
    heads = q_heads + kv_heads
    rope = rotary_table(head_dim, dtype)
    qkv = (3 * torch.randn(tokens, (heads + kv_heads) * head_dim, device=DEVICE)).to(dtype)
    qk = qkv[:, :heads * head_dim].view(tokens, heads, head_dim)  # rows strided; v after them
    positions = torch.randperm(4096, device=DEVICE)[:tokens]  # out of order, anywhere in the table
    norm_weight = weight(head_dim, dtype, heads) if qk_norm else None
    before = qkv.clone()
    ref_in = rms_norm(qk, norm_weight, EPS) if norm_weight is not None else qk.clone()
    cos, sin = rope.lookup(positions)
    ref = apply_rotary(ref_in, cos, sin)

    assert fused_ops.rotary_qk(qk, positions, rope.cos, rope.sin, norm_weight, EPS) is None
    if qk_norm:
        # A normalised value 1 ulp apart (sums of squares in another order) stays about 1 ulp of the
        # product terms apart, which x * cos - x' * sin can cancel down to a far smaller result.
        swapped = torch.cat((ref_in[..., head_dim // 2:], ref_in[..., :head_dim // 2]), dim=-1)
        assert_matches(qk, ref, ulps=2, scale=ref_in.abs() * cos.abs() + swapped.abs() * sin.abs())
    else:
        assert_matches(qk, ref)
    assert torch.equal(qkv[:, heads * head_dim:], before[:, heads * head_dim:]), "v must be left untouched"


def test_rotary_qk_takes_int32_positions():
    torch.manual_seed(5)
    rope = rotary_table(64, torch.float32)
    qk = torch.randn(3, 5, 64, device=DEVICE)
    positions = torch.tensor([7, 3, 4000], device=DEVICE)
    ref = apply_rotary(qk, *rope.lookup(positions))
    fused_ops.rotary_qk(qk, positions.int(), rope.cos, rope.sin)
    assert_matches(qk, ref)


def test_empty_batches_launch_nothing():
    w = torch.ones(8, device=DEVICE)
    assert fused_ops.rms_norm(torch.empty(0, 8, device=DEVICE), w, EPS).shape == (0, 8)
    assert fused_ops.silu_and_mul(torch.empty(0, 16, device=DEVICE)).shape == (0, 8)
    rope = rotary_table(64, torch.float32)
    fused_ops.rotary_qk(torch.empty(0, 2, 64, device=DEVICE), torch.empty(0, dtype=torch.int64, device=DEVICE),
                        rope.cos, rope.sin)


def test_bad_inputs_are_refused_with_a_reason():
    x, w = torch.randn(4, 8, device=DEVICE), torch.ones(8, device=DEVICE)
    with pytest.raises(ValueError, match="2-D"):
        fused_ops.rms_norm(x[None], w, EPS)
    with pytest.raises(ValueError, match="weight must be contiguous of shape"):
        fused_ops.rms_norm(x, torch.ones(9, device=DEVICE), EPS)
    with pytest.raises(ValueError, match="last dimension must be contiguous"):
        fused_ops.rms_norm(x.t(), torch.ones(4, device=DEVICE), EPS)
    with pytest.raises(ValueError, match="residual must match x"):
        fused_ops.add_rms_norm(x, x.half(), w, EPS)
    with pytest.raises(ValueError, match="even"):
        fused_ops.silu_and_mul(torch.randn(2, 7, device=DEVICE))
    rope = rotary_table(64, torch.float32)
    qk = torch.randn(3, 2, 64, device=DEVICE)
    with pytest.raises(ValueError, match="positions must be"):
        fused_ops.rotary_qk(qk, torch.zeros(3, device=DEVICE), rope.cos, rope.sin)
    with pytest.raises(ValueError, match="cos_table must be"):
        fused_ops.rotary_qk(qk, torch.zeros(3, dtype=torch.int64, device=DEVICE), rope.cos.half(), rope.sin)
    with pytest.raises(ValueError, match="norm_weight must be"):
        fused_ops.rotary_qk(qk, torch.zeros(3, dtype=torch.int64, device=DEVICE), rope.cos, rope.sin,
                            torch.ones(2, 64, dtype=torch.float16, device=DEVICE), EPS)
