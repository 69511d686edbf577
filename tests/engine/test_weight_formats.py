"""Narrow weights: the int8 quantizer and the C kernel for bf16 / int8 projections against torch in
float64, at decode (1-3 rows) and prefill (many rows) sizes. No model."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from raypd.engine.model import cpu_paths, linear
from raypd.engine.model.linear import LinearFactory, PackedLinear, RowSplitLinear, choose_linears
from raypd.engine.model.native_linear import NativeLinear
from raypd.engine.model.quantization import DequantizedLinear, dequantize, quantize_int8, quantize_int8_groups
from tests.engine.cpu_support import require_bf16_packing
from tests.engine.rounding import assert_within, float32_sum_bound, projection_bound

CPU = torch.device("cpu")
PORTABLE = cpu_paths.PATHS["portable"].cflags  # the kernel's plain-C variant, for CPUs without AVX2


def reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, fmt: str) -> torch.Tensor:
    """What the kernel computes, in float64: the weights as the format stores them."""
    if fmt in ("int8", "int8-g32"):
        w = dequantize(fmt, w)
    elif fmt == "bfloat16":
        w = w.bfloat16()
    return F.linear(x.double(), w.double(), None if bias is None else bias.double())


def case(rows: int, n: int, k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g), torch.randn(n, generator=g), torch.randn(rows, k, generator=g)


@pytest.mark.parametrize("fmt", ["bfloat16", "int8", "int8-g32"])
@pytest.mark.parametrize("act", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 50, 300])  # decode tiles, the first tiled size, prefill chunks
def test_kernel_matches_float64(fmt, act, rows):
    # n and k off the kernel's multiples (4 rows, 16 or 32 columns): the padding must never show.
    w, b, x = case(rows, 70, 150, seed=rows)
    x = x.to(act)
    for bias in (None, b):
        y = NativeLinear(w, bias, fmt, act, num_threads=2)(x)
        assert y.dtype == act and y.shape == (rows, 70)
        ref = reference(x, w, bias, fmt)
        # int8's int16 rounding of x, float32 sums in any order, a bf16 output's own rounding (rounding.py)
        assert_within(y, ref, projection_bound(x, w, fmt, ref))


def test_leading_dimensions_are_kept():
    w, _, x = case(6, 12, 32)
    y = NativeLinear(w, None, "int8", torch.float32, 1)(x.view(2, 3, 32))
    assert y.shape == (2, 3, 12)
    ref = reference(x, w, None, "int8")
    assert_within(y.view(6, 12), ref, projection_bound(x, w, "int8", ref))


@pytest.mark.parametrize("fmt", ["int8", "int8-g32"])
@pytest.mark.parametrize("rows", [1, 3, 7, 100])
def test_int8_rows_do_not_depend_on_threads_or_batch(fmt, rows):
    # A row is computed the same way on any thread count, alone or in a batch (streamed when <= 3
    # rows, tiled above): int8's sums are exact integers; int8-g32 adds exact group sums in a fixed
    # order. Exact integers also make int8's plain-C build give the same bits.
    w, b, x = case(rows, 90, 200, seed=3)
    one = NativeLinear(w, b, fmt, torch.float32, 1)(x)
    for threads in (2, 3):
        assert torch.equal(NativeLinear(w, b, fmt, torch.float32, threads)(x), one)
    assert torch.equal(NativeLinear(w, b, fmt, torch.float32, 2)(x[-1:]), one[-1:])
    portable = NativeLinear(w, b, fmt, torch.float32, 2, extra_flags=PORTABLE)(x)
    if fmt == "int8":
        assert torch.equal(portable, one)
    else:
        # the same int16 rounding on both; the groups' float32 sums may contract and order differently
        assert_within(portable, one, 2 * float32_sum_bound(x, w))


def test_portable_build_computes_bf16_weights_too():
    w, b, x = case(5, 40, 64)
    portable = NativeLinear(w, b, "bfloat16", torch.float32, 2, extra_flags=PORTABLE)(x)
    ref = reference(x, w, b, "bfloat16")
    assert_within(portable, ref, projection_bound(x, w.bfloat16(), "bfloat16", ref))


def test_long_rows_do_not_overflow_the_integer_sums():
    # 9000 products of 127 * 32767 per output: past what int32 lanes hold, so the kernel must flush.
    k = 9000
    w, x = torch.full((4, k), 0.5), torch.full((2, k), 3.0)
    w[1] = -0.5
    y = NativeLinear(w, None, "int8", torch.float32, 2)(x)
    torch.testing.assert_close(y, torch.tensor([[1.0, -1.0, 1.0, 1.0]] * 2) * 1.5 * k, rtol=1e-6, atol=0)


def test_non_finite_activations_give_nan_like_a_float_matmul():
    w, _, x = case(2, 8, 32)
    x[0, 5] = float("inf")
    y = NativeLinear(w, None, "int8", torch.float32, 1)(x)
    assert y[0].isnan().all() and y[1].isfinite().all()


def test_quantize_int8_rounds_each_row_to_its_own_scale():
    w = torch.randn(5, 64) * torch.tensor([1e-3, 1.0, 30.0, 1.0, 0.0])[:, None]
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32
    assert q[:4].abs().amax(dim=1).tolist() == [127] * 4  # every row uses the full range
    assert scale[4] == 1 and not q[4].any()  # an all-zero row
    err = (q.float() * scale[:, None] - w).abs()
    assert (err <= scale[:, None] / 2 + 1e-7).all()


def test_groups_reproduce_gguf_4_bit_and_8_bit_blocks():
    # Q4_1 blocks (w = d * q + m, q in 0..15 with both ends used) and Q8_0 blocks (w = d * q, max |q|
    # = 127): what a GGUF checkpoint stores, and what int8-g32 must reproduce to float32 rounding.
    g = torch.Generator().manual_seed(5)
    q4 = torch.randint(0, 16, (6, 4, 32), generator=g).float()
    q4[..., 0], q4[..., 1] = 0, 15
    w4 = (q4 * torch.rand(6, 4, 1, generator=g) * 0.1 + torch.randn(6, 4, 1, generator=g) * 0.1).view(6, 128)
    q8 = torch.randint(-127, 128, (6, 4, 32), generator=g).float()
    q8[..., 0] = 127
    w8 = (q8 * torch.rand(6, 4, 1, generator=g) * 0.01).view(6, 128)
    for w in (w4, w8):
        torch.testing.assert_close(dequantize("int8-g32", w), w, atol=2e-7 * w.abs().max().item(), rtol=0)
        assert (dequantize("int8", w) - w).abs().max() > 1e-4  # a scale per row cannot
    q, scale, offset = quantize_int8_groups(w8)
    assert not offset.any() and q.abs().amax().item() == 127  # Q8_0 groups stay symmetric


@pytest.mark.parametrize("fmt", ["int8", "int8-g32"])
def test_dequantized_torch_path_computes_the_same_format(fmt):
    w, b, x = case(9, 33, 48)
    # F.linear on the widened weights against the kernel: each within its bound of float64 (rounding.py)
    ref = reference(x, w, b, fmt)
    assert_within(DequantizedLinear(w, b, fmt)(x), ref, float32_sum_bound(x, w))
    assert_within(NativeLinear(w, b, fmt, torch.float32, 2)(x), ref, projection_bound(x, w, fmt, ref))


def test_wrong_activation_dtype_is_refused():
    w, _, x = case(1, 8, 16)
    with pytest.raises(TypeError, match="bfloat16"):
        NativeLinear(w, None, "int8", torch.bfloat16, 1)(x)
    with pytest.raises(ValueError, match="float16"):
        NativeLinear(w, None, "int8", torch.float16, 1)


@pytest.mark.parametrize("dtype, quantization, fast, expected", [
    (torch.float32, "none", True, LinearFactory("onednn")),
    (torch.float32, "int8", True, LinearFactory("native", "int8", 2)),
    (torch.bfloat16, "none", True, LinearFactory("native", "bfloat16", 2)),
    (torch.bfloat16, "int8", True, LinearFactory("native", "int8", 2)),
    (torch.float16, "int8", True, LinearFactory("dequantized", "int8")),  # the kernel takes no float16
    (torch.float32, "int8", False, LinearFactory("dequantized", "int8")),  # cpu_kernels="torch"
    (torch.float32, "int8-g32", True, LinearFactory("native", "int8-g32", 2)),
    (torch.float32, "int8-g32", False, LinearFactory("dequantized", "int8-g32")),
    (torch.bfloat16, "none", False, LinearFactory("torch")),
])
def test_choice_of_projections(dtype, quantization, fast, expected, monkeypatch):
    monkeypatch.setattr(linear, "bf16_matrix_units", lambda: False)
    choice = choose_linears(CPU, dtype, quantization, fast, num_threads=2)
    assert choice.factory == expected
    assert (choice.fallback is None) == (expected.kind != "dequantized" or not fast)


@pytest.mark.parametrize("dtype, quantization, expected", [
    (torch.bfloat16, "none", LinearFactory("row-split", "bfloat16", 2)),
    (torch.bfloat16, "int8-g32", LinearFactory("native", "int8-g32", 2)),  # no bf16 copy of int8 weights
    (torch.float32, "none", LinearFactory("onednn")),
])
def test_bf16_weights_take_onednn_for_many_rows_where_the_cpu_has_bf16_matrix_units(dtype, quantization, expected,
                                                                                    monkeypatch):
    require_bf16_packing()
    monkeypatch.setattr(linear, "bf16_matrix_units", lambda: True)
    assert choose_linears(CPU, dtype, quantization, True, num_threads=2).factory == expected


def test_without_onednn_bf16_weights_stay_on_the_kernel_whatever_the_cpu_multiplies(monkeypatch):
    monkeypatch.setattr(linear, "bf16_matrix_units", lambda: True)
    monkeypatch.setattr(linear, "packing_unavailable", lambda device, dtype: "no oneDNN bf16 linear on this path")
    assert choose_linears(CPU, torch.bfloat16, "none", True, num_threads=2).factory == \
        LinearFactory("native", "bfloat16", 2)


def test_row_split_runs_few_rows_on_the_kernel_and_many_on_onednn():
    require_bf16_packing()
    w, b, _ = case(1, 40, 48)
    split = LinearFactory("row-split", "bfloat16", 2)(w.bfloat16(), b.bfloat16())
    assert isinstance(split, RowSplitLinear) and isinstance(split.wide, PackedLinear)
    assert split.narrow.format == "bfloat16"
    for rows in (1, split.min_rows - 1, split.min_rows, 4 * split.min_rows):
        x = torch.randn(rows, 48, generator=torch.Generator().manual_seed(rows)).bfloat16()
        took = split.narrow if rows < split.min_rows else split.wide
        torch.testing.assert_close(split(x), took(x), atol=0, rtol=0)
        # either half computes the same bf16 projection (float32 sums in a different order)
        ref = reference(x, w, b.bfloat16(), "bfloat16")
        assert_within(split(x), ref, projection_bound(x, w.bfloat16(), "bfloat16", ref))


def test_quantization_option_and_flag():
    import argparse

    from raypd.cluster.cli.engine_args import add_engine_args, engine_options
    from raypd.engine.config import EngineConfig
    from raypd.engine.errors import ConfigError

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_options(parser.parse_args([]))["quantization"] == "none"
    assert engine_options(parser.parse_args(["--quantization", "int8"]))["quantization"] == "int8"
    assert engine_options(parser.parse_args(["--quantization", "int8-g32"]))["quantization"] == "int8-g32"
    gpu = engine_options(parser.parse_args(["--attention-backend", "torch", "--enforce-eager"]))
    assert (gpu["attention_backend"], gpu["enforce_eager"]) == ("torch", True)
    assert (engine_options(parser.parse_args([]))["attention_backend"], engine_options(parser.parse_args([]))["enforce_eager"]) \
        == ("auto", False)
    with pytest.raises(ConfigError, match="quantization"):
        EngineConfig(quantization="int4")  # type: ignore[arg-type]
