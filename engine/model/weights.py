"""Read a Hugging Face Llama-family checkpoint (safetensors, possibly sharded) into ModelWeights,
one tensor at a time: each is read from its file, cast and moved to the device before the next is
read, so host memory holds about one tensor (plus one layer's fused q/k/v and gate/up) instead of
the whole checkpoint, which for an 8B model would be 16-32 GB of host RAM before the GPU sees any."""
from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

from raypd.engine.errors import ModelLoadError
from raypd.engine.model.config import ModelConfig
from raypd.engine.model.llama import LayerWeights, ModelWeights


class CheckpointReader:
    """Tensors of a folder's *.safetensors files by name, read lazily. Use as a context manager."""

    def __init__(self, model_dir: Path):
        self.files = sorted(Path(model_dir).glob("*.safetensors"))
        if not self.files:
            raise ModelLoadError(f"no *.safetensors files in {model_dir}")
        self._stack = ExitStack()
        self._where: dict[str, object] = {}

    def __enter__(self) -> CheckpointReader:
        for f in self.files:
            handle = self._stack.enter_context(safe_open(str(f), framework="pt"))
            for name in handle.keys():
                self._where[name] = handle
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        handle = self._where.get(name)
        if handle is None:
            raise ModelLoadError(f"checkpoint is missing tensor {name!r}")
        return handle.get_tensor(name).to(device=device, dtype=dtype)  # type: ignore[attr-defined]


def load_weights(cfg: ModelConfig, model_dir: Path, dtype: torch.dtype, device: torch.device) -> ModelWeights:
    with CheckpointReader(model_dir) as ckpt:
        def get(name: str) -> torch.Tensor:
            return ckpt.get(name, dtype, device)

        layers = []
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            layers.append(LayerWeights(
                input_norm=get(p + "input_layernorm.weight"),
                qkv=torch.cat([get(p + f"self_attn.{x}_proj.weight") for x in "qkv"]).contiguous(),
                qkv_bias=(torch.cat([get(p + f"self_attn.{x}_proj.bias") for x in "qkv"])
                          if cfg.attention_bias else None),
                q_norm=get(p + "self_attn.q_norm.weight") if cfg.qk_norm else None,
                k_norm=get(p + "self_attn.k_norm.weight") if cfg.qk_norm else None,
                o=get(p + "self_attn.o_proj.weight"),
                post_norm=get(p + "post_attention_layernorm.weight"),
                gate_up=torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")]).contiguous(),
                down=get(p + "mlp.down_proj.weight"),
            ))
        embed = get("model.embed_tokens.weight")
        tied = cfg.tie_word_embeddings or "lm_head.weight" not in ckpt
        return ModelWeights(embed=embed, layers=layers, norm=get("model.norm.weight"),
                            lm_head=embed if tied else get("lm_head.weight"))
