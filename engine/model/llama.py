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
from raypd.engine.model.linear import Linear
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


class LlamaModel:
    def __init__(self, cfg: ModelConfig, weights: ModelWeights, device: torch.device, dtype: torch.dtype,
                 packed_linears: bool = False):
        """packed_linears: run projections through oneDNN with prepacked weights (linear.py); the
        unpacked copies are not kept."""
        self.cfg = cfg
        self.embed = weights.embed
        self.norm = weights.norm
        self.layers = [_Layer(lw.input_norm, Linear(lw.qkv, lw.qkv_bias, packed_linears), Linear(lw.o, None, packed_linears),
                              lw.post_norm, Linear(lw.gate_up, None, packed_linears), Linear(lw.down, None, packed_linears))
                       for lw in weights.layers]
        self.lm_head = Linear(weights.lm_head, None, packed_linears)
        self.rope = RotaryTable(cfg, device, dtype)
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv: PagedKVCache, logits_index: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        h = F.embedding(input_ids, self.embed)
        cos, sin = self.rope.lookup(positions)
        heads = cfg.num_heads
        for i, lw in enumerate(self.layers):
            x = rms_norm(h, lw.input_norm, cfg.rms_norm_eps)
            qkv = lw.qkv(x)
            # Rotate q and k heads in one pass, then split.
            qk = apply_rotary(qkv[:, :self.q_size + self.kv_size].view(-1, heads + cfg.num_kv_heads, cfg.head_dim),
                              cos, sin)
            q, k = qk[:, :heads], qk[:, heads:]
            v = qkv[:, self.q_size + self.kv_size:].view(-1, cfg.num_kv_heads, cfg.head_dim)
            a = paged_attention(i, q, k, v, kv, meta)
            h = h + lw.o(a.flatten(1))
            x = rms_norm(h, lw.post_norm, cfg.rms_norm_eps)
            gate, up = lw.gate_up(x).chunk(2, dim=-1)
            h = h + lw.down(F.silu(gate) * up)
        h = rms_norm(h[logits_index], self.norm, cfg.rms_norm_eps)
        return self.lm_head(h).float()
