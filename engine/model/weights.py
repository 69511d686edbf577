"""Read a Hugging Face Llama checkpoint (safetensors, possibly sharded) into ModelWeights."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from raypd.engine.errors import ModelLoadError
from raypd.engine.model.config import ModelConfig
from raypd.engine.model.llama import LayerWeights, ModelWeights


def read_safetensors(model_dir: Path) -> dict[str, torch.Tensor]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors files in {model_dir}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                tensors[name] = st.get_tensor(name)
    return tensors


def build_weights(cfg: ModelConfig, t: dict[str, torch.Tensor], dtype: torch.dtype,
                  device: torch.device) -> ModelWeights:
    def get(name: str) -> torch.Tensor:
        if name not in t:
            raise ModelLoadError(f"checkpoint is missing tensor {name!r}")
        return t[name].to(device=device, dtype=dtype)

    layers = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        qkv = torch.cat([get(p + f"self_attn.{x}_proj.weight") for x in "qkv"]).contiguous()
        bias = (torch.cat([get(p + f"self_attn.{x}_proj.bias") for x in "qkv"]) if cfg.attention_bias else None)
        layers.append(LayerWeights(
            input_norm=get(p + "input_layernorm.weight"),
            qkv=qkv,
            qkv_bias=bias,
            o=get(p + "self_attn.o_proj.weight"),
            post_norm=get(p + "post_attention_layernorm.weight"),
            gate_up=torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")]).contiguous(),
            down=get(p + "mlp.down_proj.weight"),
        ))
    embed = get("model.embed_tokens.weight")
    tied = cfg.tie_word_embeddings or "lm_head.weight" not in t
    return ModelWeights(embed=embed, layers=layers, norm=get("model.norm.weight"),
                        lm_head=embed if tied else get("lm_head.weight"))
