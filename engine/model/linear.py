"""Projections y = x @ W.T (+ b), and which implementation a model's weights get (LinearFactory).

    kind         weights                          where                    why
    torch        engine dtype, F.linear           any device               the reference path
    onednn       float32, prepacked for oneDNN    CPU                      MKL's sgemm behind F.linear
                                                                           reaches 60-130 GFLOP/s on these
                                                                           shapes, oneDNN on its blocked
                                                                           layout 110-190 (the LM head
                                                                           27 -> 11 ms per 32-row step)
    native       bfloat16, or int8 (row or group  CPU with a C compiler    a decode step streams every
                 scales; native_linear.py)                                 weight once: fewer bytes per
                                                                           weight are the time
    dequantized  int8, widened per call           any device               int8 where the kernel is
                 (quantization.py)                                         missing: same numbers, slower
    row-split    bfloat16, twice: the C kernel's  CPU with AMX or          the C kernel for a few rows
                 layout and oneDNN's packed one   AVX512-BF16 and the      (weight bytes are the time),
                                                  C kernel                 oneDNN's bf16 tiles from
                                                                           ROW_SPLIT_MIN_ROWS rows on
                                                                           (prefill chunks, big decode
                                                                           batches: arithmetic is the
                                                                           time; 0.6-1.8 TFLOP/s against
                                                                           the kernel's ~0.1)

oneDNN's pair of ops is internal to torch (torch.ops.mkldnn._reorder_linear_weight /
_linear_pointwise, exposed for its compiler), so they are probed before use; torch's own bf16 and
int8 CPU matmuls are 2-10x slower than float32 on a CPU without AVX-512, hence the C kernel for
narrow weights (docs/benchmarks.md). On a CPU with bf16 matrix units (AMX tiles, AVX512-BF16)
oneDNN's bf16 GEMM is 3-6x its float32 one from 32 rows up and passes the C kernel from about 4
rows, while below that the C kernel is up to 2x faster (docs/benchmarks.md): there bf16 weights are
kept in both layouts (row-split), which costs the memory of float32 weights.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, Protocol

import torch
import torch.nn.functional as F

from raypd.engine.model import cpu_paths
from raypd.engine.model.native_build import KernelUnavailable
from raypd.engine.model.native_linear import NativeLinear
from raypd.engine.model.quantization import DequantizedLinear

PACK_BATCH_HINT = 32  # oneDNN picks its blocking for this many rows; measured best for 1..512
# Rows from which a row-split projection leaves the C kernel for oneDNN's bf16 GEMM (measured on
# AMX: docs/benchmarks.md); a decode step with fewer sequences still runs the fused C layers.
ROW_SPLIT_MIN_ROWS = 8
# oneDNN projections see bounded row counts (padded_rows): exact up to EXACT_ROWS (decode batches of
# a few sequences pay no padding), above it 2**ROW_BUCKET_BITS buckets per octave.
EXACT_ROWS = 16
ROW_BUCKET_BITS = 3
LinearKind = Literal["torch", "onednn", "native", "dequantized", "row-split"]


class Linear(Protocol):
    out_features: int
    in_features: int
    packed: bool  # weights prepacked for oneDNN

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


class TorchLinear:
    packed = False

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.out_features, self.in_features = weight.shape
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


def padded_rows(rows: int) -> int:
    """The row count a oneDNN projection is called with for `rows` rows: up to EXACT_ROWS as is, then
    rounded up to one of the 2**ROW_BUCKET_BITS steps of its power-of-two octave (<= 12.5% padding).

    Why: oneDNN builds a primitive (JIT-compiled brgemm kernels and their descriptors, ~0.6 MB of
    heap and ~0.1 MB of code resident) for every input shape it is called with and keeps it in its
    primitive cache (1024 entries). A prefill step's row count is the sum of its prompt chunks, any
    number up to max_num_batched_tokens, so each new count made four more primitives, kept: the
    soak's prefill node grew by hundreds of MiB (issue 33). Buckets bound the shapes: 56 up to 512
    rows. The price: ~5% more arithmetic in prefill projections, plus the padded copy (the
    soak's prefill-only probe, benchmarks/soak/heap_probe.py: ~9% fewer prompt tokens/s)."""
    if rows <= EXACT_ROWS:
        return rows
    step = 1 << ((rows - 1).bit_length() - 1 - ROW_BUCKET_BITS)
    return -(-rows // step) * step


class PackedLinear:
    """The weight reordered once into oneDNN's blocked layout; the unpacked copy is not kept. Inputs
    are padded with zero rows to padded_rows(), whose results are dropped: a row's result does not
    depend on the rows beside it, bit for bit (tests/engine/test_onednn_shapes.py, on every CPU path)."""
    packed = True

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_BATCH_HINT)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        pad = padded_rows(rows) - rows
        if not pad:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        x2 = F.pad(x.reshape(rows, self.in_features), (0, 0, 0, pad))
        y = torch.ops.mkldnn._linear_pointwise(x2, self.weight, self.bias, "none", [], "")
        return y[:rows].view(*x.shape[:-1], self.out_features)


class RowSplitLinear:
    """One projection's bf16 weights twice: few rows through the C kernel, many through oneDNN."""
    packed = False

    def __init__(self, narrow: NativeLinear, wide: PackedLinear, min_rows: int = ROW_SPLIT_MIN_ROWS):
        self.narrow, self.wide, self.min_rows = narrow, wide, min_rows
        self.out_features, self.in_features = narrow.out_features, narrow.in_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        return self.narrow(x) if rows < self.min_rows else self.wide(x)


def narrow_kernel(linear: object) -> NativeLinear | None:
    """The C-kernel projection a linear runs its few-row calls on (native_decoder.py), if any."""
    if isinstance(linear, RowSplitLinear):
        return linear.narrow
    return linear if isinstance(linear, NativeLinear) else None


@dataclass(frozen=True, slots=True)
class LinearFactory:
    """Builds every projection of a model the same way: factory(weight, bias) -> Linear."""
    kind: LinearKind
    weight_format: Literal["engine dtype", "bfloat16", "int8", "int8-g32"] = "engine dtype"
    num_threads: int = 1  # the native kernel's

    def __call__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
        if self.kind == "onednn":
            return PackedLinear(weight, bias)
        if self.kind == "native":
            assert self.weight_format != "engine dtype", "the native kernel is for narrow weights"
            return NativeLinear(weight, bias, self.weight_format, weight.dtype, self.num_threads)
        if self.kind == "row-split":
            assert self.weight_format == "bfloat16", "row-split projections are bf16"
            return RowSplitLinear(NativeLinear(weight, bias, "bfloat16", weight.dtype, self.num_threads),
                                  PackedLinear(weight, bias))
        if self.kind == "dequantized":
            assert self.weight_format in ("int8", "int8-g32"), "dequantized projections are int8"
            return DequantizedLinear(weight, bias, self.weight_format)
        return TorchLinear(weight, bias)

    def describe(self) -> str:
        return f"{self.kind} projections ({self.weight_format} weights)"


TORCH_LINEARS = LinearFactory("torch")


@dataclass(frozen=True, slots=True)
class LinearChoice:
    factory: LinearFactory
    fallback: str | None  # why the fast path for these weights is not taken; None when it is


def choose_linears(device: torch.device, dtype: torch.dtype, quantization: str, fast_paths: bool,
                   num_threads: int) -> LinearChoice:
    """The projections for weights in `dtype` (int8 when quantization == "int8") on `device`.
    fast_paths False: plain torch (cpu_kernels="torch")."""
    narrow: Literal["int8", "int8-g32", "bfloat16"] | None = (
        "int8" if quantization == "int8" else "int8-g32" if quantization == "int8-g32"
        else "bfloat16" if dtype == torch.bfloat16 else None)
    slow = LinearFactory("torch") if narrow in (None, "bfloat16") else LinearFactory("dequantized", narrow)
    if not fast_paths:
        return LinearChoice(slow, None)
    if narrow is None:
        why_not = packing_unavailable(device, dtype)
        return LinearChoice(LinearFactory("onednn") if why_not is None else slow, why_not)
    why_not = native_unavailable(device, dtype)
    if why_not is None:
        if narrow == "bfloat16" and bf16_matrix_units() and packing_unavailable(device, dtype) is None:
            return LinearChoice(LinearFactory("row-split", narrow, num_threads), None)
        return LinearChoice(LinearFactory("native", narrow, num_threads), None)
    if narrow == "bfloat16" and packing_unavailable(device, dtype) is None:
        return LinearChoice(LinearFactory("onednn"), why_not)
    return LinearChoice(slow, why_not)


def native_unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    """None when the narrow-weight kernel can run here with `dtype` activations, else why not."""
    if device.type != "cpu":
        return f"weights are on {device.type}"
    if dtype not in (torch.float32, torch.bfloat16):
        return f"the narrow-weight kernel takes float32 or bfloat16 activations, not {dtype}"
    try:
        NativeLinear(torch.zeros(4, 16), None, "int8", dtype, 1)
    except KernelUnavailable as e:
        return str(e)
    return None


def bf16_matrix_units() -> bool:
    """True when this CPU multiplies bf16 matrices in hardware (AMX tiles or AVX512-BF16), where
    oneDNN's bf16 GEMM outruns both its float32 one and the C kernel from a few rows up, and the
    process is not held to a path below them (cpu_paths.py)."""
    if not cpu_paths.held().bf16_matrix_units:
        return False
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")  # private to torch: may go away
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def packing_unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    """None when weights can be prepacked for oneDNN on this device and dtype, else why not."""
    if device.type != "cpu":
        return f"weights are on {device.type}"
    if dtype not in (torch.float32, torch.bfloat16):
        return f"no packed linear for {dtype}"
    return _probe(dtype)


@lru_cache(maxsize=None)
def _probe(dtype: torch.dtype) -> str | None:
    # The ops are internal to torch: check they exist and agree with F.linear before trusting them.
    try:
        w, x = torch.randn(24, 16, dtype=dtype), torch.randn(3, 16, dtype=dtype)
        y = PackedLinear(w)(x)
    except (AttributeError, RuntimeError) as e:
        return f"torch has no usable oneDNN linear: {e}"
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    if not torch.allclose(y.float(), F.linear(x, w).float(), atol=tol, rtol=tol):
        return "oneDNN linear disagrees with F.linear"
    return None
