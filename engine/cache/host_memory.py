"""Zeroed host tensors backed by transparent huge pages where the kernel offers them.

Why: the KV pool is what moves between processes, and on a CPU host NIXL/UCX moves it with CMA
(process_vm_writev), which pins every destination page before copying into it. With 4 KiB pages
that pinning made a cross-process write run at 40-55% of an in-process copy; with 2 MiB pages it
runs at 80-95% (docs/benchmarks.md, "KV block transfer"). Fewer TLB misses also help attention,
which walks the whole pool. Linux only; elsewhere, or with THP set to "never", this is torch.zeros.
"""
from __future__ import annotations

import ctypes
import logging
import math
import sys

import torch

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14  # linux/mman.h


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """torch.zeros(shape), placed on huge pages when the tensor is on the host and large."""
    device = torch.device(device)
    nbytes = math.prod(shape) * dtype.itemsize
    if device.type != "cpu" or sys.platform != "linux" or nbytes < HUGE_PAGE:
        return torch.zeros(shape, dtype=dtype, device=device)
    # Over-allocate by one huge page and start the tensor on a 2 MiB boundary; the returned view
    # keeps the whole buffer alive.
    raw = torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8)
    offset = -raw.data_ptr() % HUGE_PAGE
    start = raw.data_ptr() + offset
    _advise_huge(start, nbytes - nbytes % HUGE_PAGE)
    out = raw[offset:offset + nbytes].view(dtype).view(shape)
    out.zero_()  # first touch after the advice, so the pages fault in huge
    return out


def _advise_huge(addr: int, length: int) -> None:
    if length <= 0:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        if libc.madvise(addr, length, _MADV_HUGEPAGE) != 0:
            log.info("madvise(MADV_HUGEPAGE) refused (errno %d): the KV pool stays on 4 KiB pages",
                     ctypes.get_errno())
    except (OSError, AttributeError) as e:
        log.info("no madvise here (%s): the KV pool stays on 4 KiB pages", e)
