"""raypd's node engine: model, paged KV cache, radix prefix cache, scheduler, sampling, step loop.

Imports no Ray and no other raypd package."""
from __future__ import annotations

import importlib

# Lazy exports: conductor/ imports engine.block_hash and engine.kv_events and must not pull in torch.
_EXPORTS = {
    "LLMEngine": "raypd.engine.engine", "LLM": "raypd.engine.llm", "CompletionOutput": "raypd.engine.outputs",
    "StepOutput": "raypd.engine.outputs", "SamplingParams": "raypd.engine.sampling_params",
    "EngineError": "raypd.engine.errors", "InvalidRequestError": "raypd.engine.errors", "ConfigError": "raypd.engine.errors",
    "ModelLoadError": "raypd.engine.errors", "UnsupportedModelError": "raypd.engine.errors",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'raypd.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
