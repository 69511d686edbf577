"""Weight-only int8, in two layouts (EngineConfig.quantization):

    int8      one float32 scale per output row (channel), symmetric:
              scale[n] = max_k |W[n, k]| / 127        q[n, k] = round(W[n, k] / scale[n])  in [-127, 127]
    int8-g32  a scale and an offset per 32 columns of a row (a group): W ~ q * scale_g + offset_g,
              each group either symmetric (offset 0, scale = max |W| / 127) or spread over its range
              (scale = (max - min) / 255, q in [-128, 127]), whichever reproduces it better

Per-row scales keep a row with small weights from losing its precision to another row's outliers;
per-group ones go further, at 1.25 bytes per weight instead of ~1. A GGUF checkpoint's 4-bit groups
(Q4_0, Q4_1: 16 levels over a group of 32) and Q8_0 groups land exactly on the int8-g32 grid, so
that layout reproduces such weights to float32 rounding (docs/benchmarks.md: identical greedy tokens
to the float32 reference on the benchmark prompts), where per-row int8 does not.
Activations stay in the engine's dtype. DequantizedLinear is the torch path (any device): it widens
the weights at every call, which costs time, not accuracy.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

QUANTIZATIONS = ("none", "int8", "int8-g32")
GROUP = 32  # columns per scale and offset of int8-g32 (the kernel's GROUP)


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float weights -> (int8 [N, K], float32 scales [N]); an all-zero row gets scale 1."""
    w = weight.float()
    scale = w.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale.contiguous()


def quantize_int8_groups(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N, K] float weights, K a multiple of GROUP -> (int8 [N, K], scales [N, K / GROUP], offsets
    [N, K / GROUP], float32): W[n, k] ~ q[n, k] * scale[n, g] + offset[n, g] for k in group g."""
    n, k = weight.shape
    if k % GROUP:
        raise ValueError(f"{k} columns are not a multiple of the group size {GROUP}")
    w = weight.float().view(n, k // GROUP, GROUP)
    amax, lo, hi = w.abs().amax(-1, keepdim=True), w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    sym_scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    sym = torch.round(w / sym_scale).clamp_(-127, 127)
    spread_scale = torch.where(hi > lo, (hi - lo) / 255, torch.ones_like(hi))
    spread_offset = lo + 128 * spread_scale
    spread = torch.round((w - spread_offset) / spread_scale).clamp_(-128, 127)
    sym_err = (sym * sym_scale - w).abs().amax(-1, keepdim=True)
    spread_err = (spread * spread_scale + spread_offset - w).abs().amax(-1, keepdim=True)
    use_sym = sym_err <= spread_err
    q = torch.where(use_sym, sym, spread).to(torch.int8).view(n, k)
    scale = torch.where(use_sym, sym_scale, spread_scale).view(n, -1)
    offset = torch.where(use_sym, torch.zeros_like(spread_offset), spread_offset).view(n, -1)
    return q, scale.contiguous(), offset.contiguous()


def dequantize(fmt: str, weight: torch.Tensor) -> torch.Tensor:
    """What `fmt` ("int8" or "int8-g32") stores for these weights, as float32 [N, K]."""
    if fmt == "int8":
        q, scale = quantize_int8(weight)
        return q.float() * scale[:, None]
    n, k = weight.shape
    padded = F.pad(weight.float(), (0, -k % GROUP))
    q, scale, offset = quantize_int8_groups(padded)
    w = q.float().view(n, -1, GROUP) * scale[..., None] + offset[..., None]
    return w.view(n, -1)[:, :k]


class DequantizedLinear:
    """int8 weights (either layout) through F.linear, widened to the activations' dtype per call."""
    packed = False

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, fmt: str = "int8"):
        self.out_features, self.in_features = weight.shape
        self.format = fmt
        self.bias = bias
        n, k = weight.shape
        if fmt == "int8":
            q, scale = quantize_int8(weight)
            q, scale, offset = q, scale[:, None], torch.zeros(1)
        else:
            q, scale, offset = quantize_int8_groups(F.pad(weight.float(), (0, -k % GROUP)))
            q, scale, offset = q.view(n, -1, GROUP), scale[..., None], offset[..., None]
        self._parts = (q.to(weight.device), scale.to(weight.device), offset.to(weight.device))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        q, scale, offset = self._parts
        w = (q.float() * scale + offset).view(self.out_features, -1)[:, :self.in_features]
        return F.linear(x, w.to(x.dtype), self.bias)
