"""y = x @ W.T (+ b): through oneDNN with the weight prepacked on CPU, else F.linear.

Why: for the decode batch sizes a CPU node runs (M = 1..64 rows), MKL's sgemm behind F.linear
reaches 60-130 GFLOP/s on these shapes while oneDNN with the weight reordered once into its
blocked layout reaches 110-190; the LM head (49152 x 576 for SmolLM2) drops from 27 to 11 ms per
32-row step (docs/benchmarks.md). torch exposes this pair of ops for its own compiler
(torch.ops.mkldnn._reorder_linear_weight / _linear_pointwise); where they are missing (no oneDNN
build, non-x86, GPU) the plain path is used. Results differ from F.linear only by float rounding
order; the greedy parity tests run on this path.
"""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

PACK_BATCH_HINT = 32  # oneDNN picks its blocking for this many rows; measured best for 1..512


class Linear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, packed: bool = False):
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.packed = packed
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_BATCH_HINT) if packed else weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


def packing_unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    """None when weights can be prepacked for this device and dtype, else why not."""
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
        y = Linear(w, packed=True)(x)
    except (AttributeError, RuntimeError) as e:
        return f"torch has no usable oneDNN linear: {e}"
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    if not torch.allclose(y.float(), F.linear(x, w).float(), atol=tol, rtol=tol):
        return "oneDNN linear disagrees with F.linear"
    return None
