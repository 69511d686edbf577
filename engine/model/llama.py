"""A Llama-family decoder over a flattened batch of tokens from many requests.

RMSNorm, rotary embeddings, grouped-query attention through the paged cache, SwiGLU MLP, tied or
untied output embeddings. q/k/v and gate/up projections are stored fused (one matmul each).
Logits are computed only for the tokens that sample.

Two parts are swappable, both chosen by the engine for its device:
- the layer ops (norms, rotary, SwiGLU): TorchLayerOps here, the reference; on a GPU the fused
  Triton kernels (engine/gpu/layer_ops.py), which launch one kernel where torch launches 3-8;
- the attention: paged_attention (attention.py) for the metadata the CPU runner builds; on a GPU
  the Triton kernels that read blocks in place (engine/gpu/triton_attention.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from raypd.engine.cache.kv_cache import PagedKVCache
from raypd.engine.model.attention import paged_attention
from raypd.engine.model.config import ModelConfig
from raypd.engine.model.linear import TORCH_LINEARS, Linear, LinearFactory
from raypd.engine.model.native_decoder import NativeDecoder
from raypd.engine.model.rope import RotaryTable, apply_rotary

# attention(layer, q, k, v, kv, meta) -> [T, H, D]; meta is whatever the runner built for it.
Attention = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, PagedKVCache, Any], torch.Tensor]


@dataclass(slots=True)
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor  # [(H + 2*KVH) * hd, hidden]
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # [2 * intermediate, hidden]
    down: torch.Tensor
    q_norm: torch.Tensor | None = None  # [head_dim] (Qwen3)
    k_norm: torch.Tensor | None = None


@dataclass(slots=True)
class ModelWeights:
    embed: torch.Tensor
    layers: list[LayerWeights]
    norm: torch.Tensor
    lm_head: torch.Tensor  # the embedding itself when tied


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Normalise in float32 and cast back before the weight, as Hugging Face Llama does.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class LayerOps(Protocol):
    """The elementwise parts of a decoder layer. The residual stream `h` is owned by the caller;
    add_rms_norm may update it in place and returns the stream to carry on with."""

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor: ...

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]: ...

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor: ...

    def rotary_inputs(self, positions: torch.Tensor, rope: RotaryTable) -> Any:
        """What rotary_qk needs for a step's positions, computed once for every layer."""
        ...

    def rotary_qk(self, qk: torch.Tensor, rotary: Any, norm_weight: torch.Tensor | None,
                  eps: float) -> torch.Tensor: ...


class TorchLayerOps:
    """The reference: plain torch ops, the numbers the parity tests hold on every device."""

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm(x, weight, eps)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        h = residual + x
        return rms_norm(h, weight, eps), h

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def rotary_inputs(self, positions: torch.Tensor, rope: RotaryTable) -> tuple[torch.Tensor, torch.Tensor]:
        return rope.lookup(positions)

    def rotary_qk(self, qk: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], norm_weight: torch.Tensor | None,
                  eps: float) -> torch.Tensor:
        if norm_weight is not None:
            qk = rms_norm(qk, norm_weight, eps)
        return apply_rotary(qk, *rotary)


TORCH_LAYER_OPS = TorchLayerOps()


@dataclass(slots=True)
class _Layer:
    input_norm: torch.Tensor
    qkv: Linear
    o: Linear
    post_norm: torch.Tensor
    gate_up: Linear
    down: Linear
    qk_norm: torch.Tensor | None  # q_norm's and k_norm's weights stacked per head: [H + KVH, head_dim]


def _stacked_qk_norm(lw: LayerWeights, cfg: ModelConfig) -> torch.Tensor | None:
    if lw.q_norm is None or lw.k_norm is None:
        return None
    return torch.cat([lw.q_norm.expand(cfg.num_heads, -1), lw.k_norm.expand(cfg.num_kv_heads, -1)]).contiguous()


class LlamaModel:
    def __init__(self, cfg: ModelConfig, weights: ModelWeights, device: torch.device, dtype: torch.dtype,
                 linears: LinearFactory = TORCH_LINEARS, ops: LayerOps = TORCH_LAYER_OPS,
                 attention: Attention = paged_attention):
        """linears: how projections are built (linear.py: F.linear, oneDNN-packed, bf16 or int8 weights
        through the C kernel); a packed or quantized copy replaces the weight it was made from.
        ops, attention: the layer's elementwise ops and its attention (see the module docstring)."""
        self.cfg = cfg
        self.ops = ops
        self.attention = attention
        self.embed = weights.embed
        self.norm = weights.norm
        self.layers = [_Layer(lw.input_norm, linears(lw.qkv, lw.qkv_bias), linears(lw.o, None),
                              lw.post_norm, linears(lw.gate_up, None), linears(lw.down, None), _stacked_qk_norm(lw, cfg))
                       for lw in weights.layers]
        self.lm_head = linears(weights.lm_head, None)
        # Decode-only steps run every layer in one C call when all projections are on the C kernel
        # (native_decoder.py; it refuses layers with a q/k norm; with row-split projections only steps
        # of fewer rows than they leave the kernel at); otherwise, and for prefill, the loop.
        decoder = NativeDecoder.for_layers(cfg, self.layers, dtype, linears.num_threads)
        self.decoder: NativeDecoder | None = decoder if isinstance(decoder, NativeDecoder) else None
        self.rope = RotaryTable(cfg, device, dtype)
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: Any,
                kv: PagedKVCache, logits_index: torch.Tensor) -> torch.Tensor:
        cfg, ops, eps = self.cfg, self.ops, self.cfg.rms_norm_eps
        h = F.embedding(input_ids, self.embed)
        heads = cfg.num_heads
        layers = self.layers
        if self.decoder is not None and NativeDecoder.serves(meta) and self.decoder.fits(input_ids.shape[0]):
            cos, sin = self.rope.lookup(positions)
            h, layers = self.decoder(h, cos, sin, kv, meta), []
        rotary = ops.rotary_inputs(positions, self.rope) if layers else None
        # The residual add of each sublayer is fused into the next norm: x is the sublayer's input,
        # `out` its output still to be added to the stream h.
        out: torch.Tensor | None = None
        for i, lw in enumerate(layers):
            if out is None:
                x = ops.rms_norm(h, lw.input_norm, eps)
            else:
                x, h = ops.add_rms_norm(out, h, lw.input_norm, eps)
            qkv = lw.qkv(x)
            # Normalise (Qwen3) and rotate q and k heads in one pass, then split.
            qk = qkv[:, :self.q_size + self.kv_size].view(-1, heads + cfg.num_kv_heads, cfg.head_dim)
            qk = ops.rotary_qk(qk, rotary, lw.qk_norm, eps)
            q, k = qk[:, :heads], qk[:, heads:]
            v = qkv[:, self.q_size + self.kv_size:].view(-1, cfg.num_kv_heads, cfg.head_dim)
            a = self.attention(i, q, k, v, kv, meta)
            x, h = ops.add_rms_norm(lw.o(a.flatten(1)), h, lw.post_norm, eps)
            out = lw.down(ops.silu_and_mul(lw.gate_up(x)))
        h = h[logits_index] if out is None else h[logits_index] + out[logits_index]
        h = ops.rms_norm(h, self.norm, eps)
        return self.lm_head(h).float()
