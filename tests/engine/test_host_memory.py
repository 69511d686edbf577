"""engine.host_memory.zeros: what torch.zeros gives, starting on a huge-page boundary when large
(the suite turns the huge pages off for every other test: tests/conftest.py), and plain
torch.zeros when RAYPD_KV_HUGE_PAGES=0."""
from __future__ import annotations

import sys

import pytest
import torch

from raypd.engine.cache import host_memory


@pytest.fixture(autouse=True)
def huge_pages_on(monkeypatch):
    monkeypatch.setenv(host_memory.HUGE_PAGES_VARIABLE, "1")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8])
def test_large_tensors_are_zeroed_contiguous_and_huge_page_aligned(dtype):
    shape = (5, 3, (2 << 20) // 3)  # 40 MiB in float32, not a whole number of huge pages
    t = host_memory.zeros(shape, dtype)
    assert t.shape == shape and t.dtype == dtype and t.is_contiguous()
    assert not t.any()
    if sys.platform == "linux":
        assert t.data_ptr() % host_memory.HUGE_PAGE == 0
    t[-1, -1, -1] = 1  # the whole range is usable
    assert t.sum().item() == 1


def test_small_tensors_are_plain_zeros():
    t = host_memory.zeros((3, 4), torch.float32)
    assert t.shape == (3, 4) and not t.any()


def test_the_kv_pool_uses_it(tiny_model_dir):
    from raypd.engine.engine import LLMEngine

    pool = LLMEngine(tiny_model_dir, num_blocks=1024).kv_cache.pool
    assert pool.numel() * pool.element_size() > host_memory.HUGE_PAGE
    if sys.platform == "linux":
        assert pool.data_ptr() % host_memory.HUGE_PAGE == 0


@pytest.mark.parametrize("setting", ["0", " 0 "])
def test_the_environment_turns_the_advice_off(monkeypatch, setting):
    advised = []
    monkeypatch.setattr(host_memory, "_advise_huge", lambda addr, length: advised.append(length))
    monkeypatch.setenv(host_memory.HUGE_PAGES_VARIABLE, setting)
    t = host_memory.zeros((8, host_memory.HUGE_PAGE), torch.uint8)
    assert t.shape == (8, host_memory.HUGE_PAGE) and not t.any() and advised == []
    monkeypatch.setenv(host_memory.HUGE_PAGES_VARIABLE, "1")
    host_memory.zeros((8, host_memory.HUGE_PAGE), torch.uint8)
    if sys.platform == "linux":
        assert advised == [8 * host_memory.HUGE_PAGE]
