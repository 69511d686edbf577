"""Which attention and layer kernels an engine runs (EngineConfig.attention_backend), and why.

    requested    on CUDA                                   on the CPU
    auto         triton when Triton imports, else torch    torch
    triton       triton, or a ConfigError saying why not   only under TRITON_INTERPRET=1 (the
                                                           tests run the kernels this way)
    flashinfer   flashinfer when it and Triton import,     a ConfigError
                 else a ConfigError saying why not
    torch        torch                                     torch

auto does not pick FlashInfer even where it is installed: its kernels compile with nvcc at an
engine's first start (minutes), and the Triton kernels are the ones measured against the targets
(docs/benchmarks.md). FlashInfer (flashinfer_attention.py) still runs the layer ops and the KV write
on Triton. The choice is logged once per engine, with the reason when auto falls back.
"""
from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass
from typing import Literal

import torch

from raypd.engine.errors import ConfigError

log = logging.getLogger(__name__)

Backend = Literal["triton", "flashinfer", "torch"]
# The backends that run on the CUDA runner (engine/gpu/runner.py): paged kernels, graphs, overlap.
GPU_BACKENDS = ("triton", "flashinfer")


@dataclass(frozen=True, slots=True)
class BackendChoice:
    backend: Backend
    why: str


def triton_unavailable(device: torch.device) -> str | None:
    """None when the Triton kernels can run on `device`, else why not."""
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed (pip install triton)"
    if device.type == "cuda":
        return None
    if os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return f"the Triton kernels run on CUDA (on {device.type} only under TRITON_INTERPRET=1)"


def flashinfer_unavailable(device: torch.device) -> str | None:
    """None when FlashInfer's kernels can run on `device`, else why not."""
    if device.type != "cuda":
        return f"FlashInfer's kernels run on CUDA, not {device.type}"
    if importlib.util.find_spec("flashinfer") is None:
        return "FlashInfer is not installed (pip install flashinfer-python; its kernels compile with nvcc)"
    return triton_unavailable(device)  # the layer ops and the KV write stay on Triton


def choose_backend(requested: str, device: torch.device) -> BackendChoice:
    if requested == "torch":
        choice = BackendChoice("torch", "asked for")
    elif requested == "triton":
        why_not = triton_unavailable(device)
        if why_not is not None:
            raise ConfigError(f"attention_backend='triton': {why_not}")
        choice = BackendChoice("triton", "asked for")
    elif requested == "flashinfer":
        why_not = flashinfer_unavailable(device)
        if why_not is not None:
            raise ConfigError(f"attention_backend='flashinfer': {why_not}")
        choice = BackendChoice("flashinfer", "asked for")
    elif device.type != "cuda":
        choice = BackendChoice("torch", f"auto on {device.type}")
    else:
        why_not = triton_unavailable(device)
        choice = BackendChoice("torch", f"auto: {why_not}") if why_not else BackendChoice("triton", "auto on CUDA")
    log.info("attention backend: %s (%s)", choice.backend, choice.why)
    return choice
