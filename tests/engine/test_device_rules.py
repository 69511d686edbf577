"""engine/device.py: which device "auto" and explicit names give, the dtype-auto rules, and the batch
defaults per device kind (an option the caller sets wins)."""
from __future__ import annotations

import pytest
import torch

from raypd.engine.device import BATCH_DEFAULTS, batch_defaults, resolve_device, resolve_dtype
from raypd.engine.engine import LLMEngine
from raypd.engine.errors import ConfigError

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


def test_dtype_auto_is_float32_on_cpu_and_bfloat16_on_cuda():
    assert resolve_dtype("auto", CPU) is torch.float32
    assert resolve_dtype("auto", CUDA, bf16_supported=True) is torch.bfloat16
    assert resolve_dtype("auto", CUDA, bf16_supported=False) is torch.float16  # e.g. a T4 or V100


@pytest.mark.parametrize("name, dtype", [("float32", torch.float32), ("bfloat16", torch.bfloat16),
                                         ("float16", torch.float16)])
def test_an_explicit_dtype_is_kept_on_any_device(name, dtype):
    assert resolve_dtype(name, CPU) is dtype
    assert resolve_dtype(name, CUDA, bf16_supported=False) is dtype


def test_an_unknown_dtype_is_a_config_error():
    with pytest.raises(ConfigError, match="int8"):
        resolve_dtype("int8", CPU)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine's answers")
def test_device_names_on_a_machine_without_cuda():
    assert resolve_device("auto") == CPU
    assert resolve_device("cpu") == CPU
    for name in ("cuda", "cuda:1"):
        with pytest.raises(ConfigError, match="CUDA is not available"):
            resolve_device(name)
    with pytest.raises(ConfigError, match="only cpu and cuda"):
        resolve_device("meta")
    with pytest.raises(ConfigError, match="device 'gpu0'"):
        resolve_device("gpu0")


def test_batch_defaults_differ_by_device_kind_and_are_copies():
    cpu, cuda = batch_defaults(CPU), batch_defaults(CUDA)
    assert cpu == BATCH_DEFAULTS["cpu"] and cuda == BATCH_DEFAULTS["cuda"]
    assert cuda["max_num_batched_tokens"] > cpu["max_num_batched_tokens"]
    cpu["max_running_requests"] = 1
    assert batch_defaults(CPU)["max_running_requests"] == BATCH_DEFAULTS["cpu"]["max_running_requests"]


def test_the_engine_takes_cpu_defaults_and_the_callers_options_win():
    engine = LLMEngine(None, num_blocks=64, max_running_requests=7)
    assert engine.device == CPU and engine.dtype is torch.float32
    assert engine.config.dtype == "auto"
    assert engine.config.max_running_requests == 7
    assert engine.config.max_num_batched_tokens == BATCH_DEFAULTS["cpu"]["max_num_batched_tokens"]
