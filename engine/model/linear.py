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

oneDNN's pair of ops is internal to torch (torch.ops.mkldnn._reorder_linear_weight /
_linear_pointwise, exposed for its compiler), so they are probed before use; torch's own bf16 and
int8 CPU matmuls are 2-10x slower than float32 on a CPU without AVX-512, hence the C kernel for
narrow weights (docs/benchmarks.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, Protocol

import torch
import torch.nn.functional as F

from raypd.engine.model.native_build import KernelUnavailable
from raypd.engine.model.native_linear import NativeLinear
from raypd.engine.model.quantization import DequantizedLinear

PACK_BATCH_HINT = 32  # oneDNN picks its blocking for this many rows; measured best for 1..512
LinearKind = Literal["torch", "onednn", "native", "dequantized"]


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


class PackedLinear:
    """The weight reordered once into oneDNN's blocked layout; the unpacked copy is not kept."""
    packed = True

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_BATCH_HINT)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


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
