"""raypd's node engine: model, paged KV cache, radix prefix cache, scheduler, sampling, step loop.

Imports no Ray and no other raypd package."""
from __future__ import annotations

import importlib

# Lazy exports: conductor/ imports engine.block_hash and engine.kv_events and must not pull in torch.
_EXPORTS = {
    "LLMEngine": "engine.engine", "LLM": "engine.llm", "CompletionOutput": "engine.outputs",
    "StepOutput": "engine.outputs", "SamplingParams": "engine.sampling_params",
    "EngineError": "engine.errors", "InvalidRequestError": "engine.errors", "ConfigError": "engine.errors",
    "ModelLoadError": "engine.errors", "UnsupportedModelError": "engine.errors",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
