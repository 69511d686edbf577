"""raypd's node engine: model, paged KV cache, radix prefix cache, scheduler, sampling, step loop.

Imports no Ray and no other raypd package."""
from engine.engine import LLMEngine
from engine.errors import ConfigError, EngineError, InvalidRequestError, ModelLoadError, UnsupportedModelError
from engine.llm import LLM
from engine.outputs import CompletionOutput, StepOutput
from engine.sampling_params import SamplingParams

__all__ = ["LLM", "LLMEngine", "SamplingParams", "CompletionOutput", "StepOutput", "EngineError",
           "InvalidRequestError", "ConfigError", "ModelLoadError", "UnsupportedModelError"]
