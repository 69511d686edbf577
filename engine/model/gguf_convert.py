"""Convert a Llama GGUF file into a Hugging Face model folder (config.json, safetensors, tokenizer).

Quantized tensors are dequantized to float32 with the `gguf` library. llama.cpp stores the q and k
projections with each head's rotary halves interleaved; they are permuted back to the Hugging Face
rotate-half layout so one model implementation serves both sources.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from raypd.engine.errors import ModelLoadError, UnsupportedModelError

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Write the Hugging Face folder for `gguf_path` into `out_dir` atomically."""
    import gguf  # local: only needed for conversion

    try:
        reader = gguf.GGUFReader(str(gguf_path))
    except Exception as e:  # the gguf library raises assorted errors on bad files
        raise ModelLoadError(f"cannot read GGUF file {gguf_path}: {e}") from e
    meta = {k: _field_value(f) for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.")}
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise UnsupportedModelError(f"unsupported GGUF architecture {arch!r}; supported: llama")
    config = _hf_config(meta, reader)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]

    tensors: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(x) for x in reversed(t.shape))  # GGUF lists dimensions fastest first
        arr = np.array(values.reshape(shape), dtype=np.float32)  # a writable copy
        name = _hf_name(t.name)
        if name.endswith("q_proj.weight"):
            arr = _unpermute(arr, heads)
        elif name.endswith("k_proj.weight"):
            arr = _unpermute(arr, kv_heads)
        tensors[name] = torch.from_numpy(arr)
    config["tie_word_embeddings"] = "lm_head.weight" not in tensors

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=".convert-"))
    try:
        save_file(tensors, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        tok.save_pretrained(str(tmp))
        try:
            os.rename(tmp, out_dir)
        except OSError:  # another process finished the same conversion first
            if not (out_dir / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _field_value(field):
    try:
        return field.contents()
    except Exception:
        return None


def _hf_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        layer, kind, suffix = parts[1], parts[2], parts[3]
        if kind not in _LAYER_NAMES:
            raise UnsupportedModelError(f"unexpected GGUF tensor {gguf_name!r}")
        return f"model.layers.{layer}.{_LAYER_NAMES[kind]}.{suffix}"
    if parts[0] in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[parts[0]]}.{parts[1]}"
    raise UnsupportedModelError(f"unexpected GGUF tensor {gguf_name!r}")


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    # llama.cpp's converter reshaped each head's rows as (2, dim/2) -> (dim/2, 2); undo it.
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_config(meta: dict, reader) -> dict:
    p = "llama."
    heads = int(meta[p + "attention.head_count"])
    vocab = meta.get(p + "vocab_size")
    if vocab is None:
        vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    hidden = int(meta[p + "embedding_length"])
    rope: dict[str, str | float] = {"rope_type": "default"}
    if meta.get(p + "rope.scaling.type") == "linear":
        rope = {"rope_type": "linear", "factor": float(meta[p + "rope.scaling.factor"])}
    tok = {k: _field_value(f) for k, f in reader.fields.items() if k.startswith("tokenizer.ggml.") and k.endswith("_id")}
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(meta[p + "feed_forward_length"]),
        "num_hidden_layers": int(meta[p + "block_count"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get(p + "attention.head_count_kv", heads)),
        "head_dim": int(meta.get(p + "rope.dimension_count", hidden // heads)),
        "rms_norm_eps": float(meta[p + "attention.layer_norm_rms_epsilon"]),
        "rope_theta": float(meta.get(p + "rope.freq_base", 10000.0)),
        "rope_scaling": rope if rope["rope_type"] != "default" else None,
        "max_position_embeddings": int(meta.get(p + "context_length", 2048)),
        "hidden_act": "silu",
        "bos_token_id": tok.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": tok.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": tok.get("tokenizer.ggml.padding_token_id"),
    }
