"""raypd's node engine (model, paged KV cache, radix prefix cache, scheduler, sampling, step loop); map in docs/architecture.md.

LLMEngine and LLM are loaded on first use (PEP 562): they import torch, and the processes that only
need this package's errors or SamplingParams (the ingress replicas, the command line's argument
checks) would otherwise pay torch's import, about 2 s of CPU each, at every start."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raypd.engine.errors import ConfigError, EngineError, InvalidRequestError, ModelLoadError, UnsupportedModelError
from raypd.engine.outputs import CompletionOutput, StepOutput
from raypd.protocol.sampling_params import SamplingParams

if TYPE_CHECKING:
    from raypd.engine.engine import LLMEngine
    from raypd.engine.llm import LLM

__all__ = ["LLM", "CompletionOutput", "ConfigError", "EngineError", "InvalidRequestError", "LLMEngine", "ModelLoadError",
           "SamplingParams", "StepOutput", "UnsupportedModelError"]

_LAZY = {"LLMEngine": "raypd.engine.engine", "LLM": "raypd.engine.llm"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
