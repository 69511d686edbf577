"""Random-weight checkpoints in the shapes of real models, built in place for GPU benchmarks:
nothing is downloaded, and the speed of a model depends on its shapes, not its weights.

`random:NAME` names one of SHAPES. It is built once into the cache folder (RAYPD_CACHE_DIR, else
~/.cache/raypd/random/NAME-seedS) as a Hugging Face folder in bfloat16 with the default model's
tokenizer (its vocabulary is the checkpoints' vocab_size), so raypd and transformers load the same
files. Weights are normal(0, 0.02) (norms 1), drawn on the GPU when there is one (a 1 B model takes
seconds there, a minute on a CPU).

    raypd bench engine --device cuda --model random:llama-1b --systems raypd,hf --concurrency 1,64,256
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from raypd.engine.model.source import cache_root, resolve_model

PREFIX = "random:"
VOCAB = 49152  # the default model's tokenizer
COMMON: dict[str, Any] = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, max_position_embeddings=4096,
                              torch_dtype="bfloat16", rms_norm_eps=1e-5)
SHAPES: dict[str, dict[str, Any]] = {
    # Llama-3.2-1B's body (16 layers, hidden 2048, GQA 32/8, intermediate 8192) with the default vocabulary: 1.07 B.
    "llama-1b": dict(architecture="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True, rope_theta=500000.0),
    # Qwen3-0.6B's body (28 layers, hidden 1024, head_dim 128, q/k norms).
    "qwen3-0.6b": dict(architecture="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                       rope_theta=1000000.0),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def copy_tokenizer(source: Path, folder: Path) -> None:
    """The tokenizer files of `source` (a Hugging Face folder) into `folder`."""
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, folder / name)


# Tiny checkpoints of every family raypd loads, for parity checks on any device (benchmarks/
# family_parity.py; tests/engine/test_model_families.py): 2 layers of width 64, the default vocabulary.
TINY_BODY: dict[str, Any] = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                 initializer_range=0.3, bos_token_id=1, eos_token_id=2)


def tiny_family(name: str, seed: int = 0, head_dim: int | None = None) -> Any:
    """A tiny random transformers model of family `name` (llama, qwen2, qwen3, llama3), its biases and
    q/k norms perturbed so that they matter (transformers starts them at 0 and 1). head_dim: wider
    heads than the body's 16 (32 for qwen3), for kernels that compile only some (FlashInfer's)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(seed)
    model: Any
    extra: dict[str, Any]
    body = dict(TINY_BODY, **({"head_dim": head_dim} if head_dim else {}))
    if name == "llama":
        model = LlamaForCausalLM(LlamaConfig(**body, tie_word_embeddings=True))
    elif name == "qwen2":  # Qwen2.5-7B's structure: q/k/v biases, untied head, sliding window switched off
        extra = dict(tie_word_embeddings=False, use_sliding_window=False, sliding_window=4096, max_window_layers=2,
                     rope_theta=1e6)
        model = Qwen2ForCausalLM(Qwen2Config(**body, **extra))
    elif name == "qwen3":
        extra = dict(tie_word_embeddings=True, rope_theta=1e6)
        model = Qwen3ForCausalLM(Qwen3Config(**dict(body, head_dim=head_dim or 32), **extra))
    elif name == "llama3":
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        model = LlamaForCausalLM(LlamaConfig(**body, rope_parameters=rope, tie_word_embeddings=False))
    else:
        raise ValueError(f"unknown family {name!r}: llama, qwen2, qwen3 or llama3")
    with torch.no_grad():
        for key, p in model.named_parameters():
            if key.endswith(".bias"):
                p.normal_(0, 0.3)
            elif key.endswith(("q_norm.weight", "k_norm.weight")):
                p.uniform_(0.5, 1.5)
    return model.eval()


TINY_FAMILIES = ("llama", "qwen2", "qwen3", "llama3")


def _config(name: str) -> Any:
    from transformers import LlamaConfig, Qwen3Config
    shape = dict(SHAPES[name])
    arch = shape.pop("architecture")
    return (Qwen3Config if arch == "qwen3" else LlamaConfig)(**COMMON, **shape)


def build_random_model(name: str, folder: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Write the checkpoint `name` into `folder` (a Hugging Face folder); returns folder."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    config = _config(name)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in AutoModelForCausalLM.from_config(config).state_dict().items()}
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(seed)
    tensors = {}
    for key, shape in shapes.items():
        if key.endswith("norm.weight"):
            t = torch.ones(shape, dtype=torch.bfloat16)
        else:
            t = torch.empty(shape, dtype=torch.float32, device=device).normal_(0, 0.02, generator=gen)
            t = t.to(torch.bfloat16).cpu()
        tensors[key] = t.contiguous()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    copy_tokenizer(tokenizer_dir, folder)
    config.save_pretrained(folder)  # last: config.json marks a complete folder
    return folder


def resolve_bench_model(spec: str | None, tokenizer_dir: str | Path | None = None, seed: int = 0) -> Path:
    """A benchmark's --model: `random:NAME` (built once, cached), a folder or .gguf, or None (the default)."""
    if spec is None or not spec.startswith(PREFIX):
        return resolve_model(spec)
    name = spec.removeprefix(PREFIX)
    if name not in SHAPES:
        raise ValueError(f"unknown random model {name!r}: choose one of {', '.join(sorted(SHAPES))}")
    folder = cache_root() / "random" / f"{name}-seed{seed}"
    config = folder / "config.json"
    if config.exists() and json.loads(config.read_text()).get("hidden_size") == SHAPES[name]["hidden_size"]:
        return folder
    source = Path(tokenizer_dir) if tokenizer_dir is not None else resolve_model(None)
    return build_random_model(name, folder, source, seed)
