"""engine.host_memory.zeros: what torch.zeros gives, starting on a huge-page boundary when large."""
from __future__ import annotations

import sys

import pytest
import torch

from raypd.engine.cache import host_memory


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


def test_the_kv_pool_uses_it(make_llm):
    pool = make_llm().engine.kv_cache.pool
    if sys.platform == "linux":
        assert pool.data_ptr() % host_memory.HUGE_PAGE == 0
