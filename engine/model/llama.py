"""A Llama-family decoder over a flattened batch of tokens from many requests.

RMSNorm, rotary embeddings, grouped-query attention through the paged cache, SwiGLU MLP, tied or
untied output embeddings. q/k/v and gate/up projections are stored fused (one matmul each).
Logits are computed only for the tokens that sample.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from raypd.engine.cache.kv_cache import PagedKVCache
from raypd.engine.model.attention import AttentionMetadata, paged_attention
from raypd.engine.model.config import ModelConfig
from raypd.engine.model.linear import TORCH_LINEARS, Linear, LinearFactory
from raypd.engine.model.native_decoder import NativeDecoder
from raypd.engine.model.rope import RotaryTable, apply_rotary


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
                 linears: LinearFactory = TORCH_LINEARS):
        """linears: how projections are built (linear.py: F.linear, oneDNN-packed, bf16 or int8 weights
        through the C kernel); a packed or quantized copy replaces the weight it was made from."""
        self.cfg = cfg
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

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv: PagedKVCache, logits_index: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        h = F.embedding(input_ids, self.embed)
        cos, sin = self.rope.lookup(positions)
        heads = cfg.num_heads
        layers = self.layers
        if self.decoder is not None and NativeDecoder.serves(meta) and self.decoder.fits(input_ids.shape[0]):
            h, layers = self.decoder(h, cos, sin, kv, meta), []
        for i, lw in enumerate(layers):
            x = rms_norm(h, lw.input_norm, cfg.rms_norm_eps)
            qkv = lw.qkv(x)
            # Normalise (Qwen3) and rotate q and k heads in one pass, then split.
            qk = qkv[:, :self.q_size + self.kv_size].view(-1, heads + cfg.num_kv_heads, cfg.head_dim)
            if lw.qk_norm is not None:
                qk = rms_norm(qk, lw.qk_norm, cfg.rms_norm_eps)
            qk = apply_rotary(qk, cos, sin)
            q, k = qk[:, :heads], qk[:, heads:]
            v = qkv[:, self.q_size + self.kv_size:].view(-1, cfg.num_kv_heads, cfg.head_dim)
            a = paged_attention(i, q, k, v, kv, meta)
            h = h + lw.o(a.flatten(1))
            x = rms_norm(h, lw.post_norm, cfg.rms_norm_eps)
            gate, up = lw.gate_up(x).chunk(2, dim=-1)
            h = h + lw.down(F.silu(gate) * up)
        h = rms_norm(h[logits_index], self.norm, cfg.rms_norm_eps)
        return self.lm_head(h).float()
