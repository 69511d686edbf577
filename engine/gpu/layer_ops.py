"""The decoder layer's elementwise ops on fused Triton kernels (fused_ops.py), behind the LayerOps
interface of engine/model/llama.py: the residual add with the next RMSNorm, SiLU x mul, and q/k
(RMSNorm per head for Qwen3, then) rotary in place, one launch each where torch launches 3-8."""
from __future__ import annotations

import torch

from raypd.engine.gpu import fused_ops
from raypd.engine.model.rope import RotaryTable


class TritonLayerOps:
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return fused_ops.rms_norm(x, weight, eps)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        return fused_ops.add_rms_norm(x, residual, weight, eps), residual  # residual updated in place

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return fused_ops.silu_and_mul(gate_up)

    def rotary_inputs(self, positions: torch.Tensor, rope: RotaryTable) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return positions, rope.cos, rope.sin

    def rotary_qk(self, qk: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                  norm_weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        positions, cos, sin = rotary
        fused_ops.rotary_qk(qk, positions, cos, sin, norm_weight, eps)
        return qk
