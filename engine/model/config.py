"""The model's shape, read from a Hugging Face config.json (a folder's, or its parsed dict)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from raypd.engine.errors import UnsupportedModelError

# Architecture -> model_type. All are the Llama decoder with per-family switches: Qwen2 adds a bias
# to q/k/v, Qwen3 an RMSNorm over each q and k head before the rotary embedding; Llama 3.x differs
# only by its rope scaling (rope.py).
SUPPORTED_ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                           "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}


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
    attention_bias: bool  # q, k and v projections have a bias (Qwen2; o_proj never has one here)
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    qk_norm: bool = False  # RMSNorm over each q and k head before rotary (Qwen3)

    @classmethod
    def from_folder(cls, model_dir: str | Path) -> ModelConfig:
        """The config of a Hugging Face model folder (what model.source.resolve_model returns)."""
        return cls.from_hf(json.loads((Path(model_dir) / "config.json").read_text()))

    @classmethod
    def from_hf(cls, cfg: dict) -> ModelConfig:
        archs = cfg.get("architectures") or []
        family = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None) \
            or (cfg.get("model_type") if cfg.get("model_type") in SUPPORTED_ARCHITECTURES.values() else None)
        if family is None:
            raise UnsupportedModelError(
                f"unsupported architecture {archs or cfg.get('model_type')!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
        if _sliding_window_layers(cfg, family):
            raise UnsupportedModelError("sliding-window attention is not supported")
        if cfg.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"unsupported activation {cfg.get('hidden_act')!r}")
        if family == "llama" and cfg.get("mlp_bias"):
            raise UnsupportedModelError("MLP biases (mlp_bias) are not supported")
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
            # Qwen2's config has no attention_bias key: its q/k/v projections always have biases.
            attention_bias=True if family == "qwen2" else bool(cfg.get("attention_bias", False)),
            qk_norm=family == "qwen3",
            eos_token_ids=tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ()),
            bos_token_id=cfg.get("bos_token_id"),
        )


def _sliding_window_layers(cfg: dict, family: str) -> bool:
    """Whether any layer attends over a sliding window shorter than the context. Qwen configs carry
    a sliding_window value even when use_sliding_window is false (Qwen2.5-7B-Instruct: 131072, off)."""
    if "sliding_attention" in (cfg.get("layer_types") or ()):  # transformers 5 names each layer's kind
        return True
    window = cfg.get("sliding_window")
    if window in (None, 0) or window >= cfg.get("max_position_embeddings", 0):
        return False
    if family in ("qwen2", "qwen3"):
        # With use_sliding_window, layers from max_window_layers on use the window.
        return bool(cfg.get("use_sliding_window")) and cfg.get("max_window_layers", 0) < cfg["num_hidden_layers"]
    return True
