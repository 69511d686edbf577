"""Where an engine runs and in which precision: the device, the dtype `auto` picks, and the batch
sizes each kind of device gets unless the caller set them.

Why per device kind: on two CPU cores a step of 512 tokens already takes ~0.3 s, so CPU batches stay
small to keep inter-token latency low; a GPU step costs about the same for 1 or 2,048 tokens, and
small batches would leave it idle. The GPU figures are vLLM's V1 defaults for chunked prefill on
one GPU (max_num_batched_tokens 8192, 256 sequences); raypd has not measured them on a GPU yet.

Precision: float32 on CPU, where token-exact parity with transformers is the reference the tests
hold; bfloat16 on CUDA (float16 on GPUs without bf16), half the memory and what flash attention
needs, with TF32 allowed for what stays float32 (norms, logits); float32 asked for on CUDA stays IEEE.
"""
from __future__ import annotations

import logging

import torch

from raypd.engine.config import BATCH_DEFAULTS
from raypd.engine.errors import ConfigError

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(requested: str) -> torch.device:
    """"auto": the current CUDA device when CUDA is usable, else the CPU; anything else as given
    ("cpu", "cuda", "cuda:1"). A CUDA device that does not exist is a ConfigError here, not a
    CUDA error at the first allocation."""
    if requested == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(requested)
    except RuntimeError as e:
        raise ConfigError(f"device {requested!r}: {e}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {requested!r}: CUDA is not available here (torch {torch.__version__})")
        count = torch.cuda.device_count()
        index = torch.cuda.current_device() if device.index is None else device.index
        if not 0 <= index < count:
            raise ConfigError(f"device {requested!r}: this process sees {count} CUDA device(s)")
        return torch.device("cuda", index)
    if device.type != "cpu":
        raise ConfigError(f"device {requested!r}: only cpu and cuda are supported")
    return device


def resolve_dtype(requested: str, device: torch.device, bf16_supported: bool | None = None) -> torch.dtype:
    """The engine's dtype: "auto" is float32 on CPU and bfloat16 on CUDA (float16 where the GPU has
    no bfloat16); an explicit choice is kept. bf16_supported: None asks torch (tests pass it)."""
    if requested != "auto":
        if requested not in DTYPES:
            raise ConfigError(f"dtype must be auto, float32, bfloat16 or float16, got {requested!r}")
        return DTYPES[requested]
    if device.type != "cuda":
        return torch.float32
    if bf16_supported is None:
        bf16_supported = torch.cuda.is_bf16_supported()
    return torch.bfloat16 if bf16_supported else torch.float16


def batch_defaults(device: torch.device) -> dict[str, int]:
    """The batch options for this kind of device (a copy: callers merge their own over it)."""
    return dict(BATCH_DEFAULTS["cuda" if device.type == "cuda" else "cpu"])


def configure_math(device: torch.device, dtype: torch.dtype) -> None:
    """Allow TF32 for the float32 matmuls that remain in a 16-bit engine on CUDA (logits, norms): the
    same choice vLLM and SGLang make. An engine asked for float32 keeps IEEE float32 (its graphs are
    captured with the matmul kernels chosen now); no effect on CPU."""
    if device.type == "cuda":
        full = dtype == torch.float32
        torch.backends.cuda.matmul.allow_tf32 = not full
        torch.backends.cudnn.allow_tf32 = not full
