"""Weight-only int8: symmetric, one float32 scale per output row (channel).

    scale[n] = max_k |W[n, k]| / 127        q[n, k] = round(W[n, k] / scale[n])  in [-127, 127]
    y = (x @ q.T) * scale                   activations stay in the engine's dtype

Per-row scales keep a row with small weights from losing its precision to another row's outliers;
the kernel applies the scale once per output, after the dot product. DequantizedLinear is the same
format for the torch path (any device): it widens the weights at every call, which costs time, not
accuracy, so a node without the C kernel still computes what one with it does.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

QUANTIZATIONS = ("none", "int8")


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float weights -> (int8 [N, K], float32 scales [N]); an all-zero row gets scale 1."""
    w = weight.float()
    scale = w.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale.contiguous()


class DequantizedLinear:
    """int8 weights with per-row scales through F.linear: widened to the activations' dtype per call."""
    packed = False

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.out_features, self.in_features = weight.shape
        self.weight, self.scale = quantize_int8(weight)
        self.weight = self.weight.to(weight.device)
        self.scale = self.scale.to(weight.device)
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        w = (self.weight.float() * self.scale[:, None]).to(x.dtype)
        return F.linear(x, w, self.bias)
