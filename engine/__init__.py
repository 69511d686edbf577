"""raypd's node engine (model, paged KV cache, radix prefix cache, scheduler, sampling, step loop); map in docs/architecture.md."""
from __future__ import annotations

from raypd.engine.engine import LLMEngine
from raypd.engine.errors import ConfigError, EngineError, InvalidRequestError, ModelLoadError, UnsupportedModelError
from raypd.engine.llm import LLM
from raypd.engine.outputs import CompletionOutput, StepOutput
from raypd.protocol.sampling_params import SamplingParams

__all__ = ["LLM", "CompletionOutput", "ConfigError", "EngineError", "InvalidRequestError", "LLMEngine", "ModelLoadError",
           "SamplingParams", "StepOutput", "UnsupportedModelError"]
