"""The model's shape, read from a Hugging Face config.json (a folder's, or its parsed dict)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from raypd.engine.errors import UnsupportedModelError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None

    @classmethod
    def from_folder(cls, model_dir: str | Path) -> ModelConfig:
        """The config of a Hugging Face model folder (what model.source.resolve_model returns)."""
        return cls.from_hf(json.loads((Path(model_dir) / "config.json").read_text()))

    @classmethod
    def from_hf(cls, cfg: dict) -> ModelConfig:
        archs = cfg.get("architectures") or []
        if not any(a in SUPPORTED_ARCHITECTURES for a in archs) and cfg.get("model_type") not in ("llama", "mistral"):
            raise UnsupportedModelError(
                f"unsupported architecture {archs or cfg.get('model_type')!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
        if cfg.get("sliding_window") not in (None, 0) and cfg["sliding_window"] < cfg.get("max_position_embeddings", 0):
            raise UnsupportedModelError("sliding-window attention is not supported")
        if cfg.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"unsupported activation {cfg.get('hidden_act')!r}")
        heads = cfg["num_attention_heads"]
        # transformers 5 moved theta and scaling into rope_parameters; older configs have rope_theta/rope_scaling.
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        theta = rope.pop("rope_theta", cfg.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        eos = cfg.get("eos_token_id")
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=rope if rope_type != "default" else None,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=cfg.get("attention_bias", False),
            eos_token_ids=tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ()),
            bos_token_id=cfg.get("bos_token_id"),
        )
