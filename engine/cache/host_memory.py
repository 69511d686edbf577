"""Zeroed host tensors backed by transparent huge pages where the kernel offers them.

Why: the KV pool is what moves between processes, and on a CPU host NIXL/UCX moves it with CMA
(process_vm_writev), which pins every destination page before copying into it. With 4 KiB pages
that pinning made a cross-process write run at 40-55% of an in-process copy; with 2 MiB pages it
runs at 80-95% (docs/benchmarks.md, "KV block transfer"). Fewer TLB misses also help attention,
which walks the whole pool. Linux only; elsewhere, or with THP set to "never", this is torch.zeros.

RAYPD_KV_HUGE_PAGES=0 turns the advice off (torch.zeros). Why one might: on a VM whose hypervisor
takes freed guest memory back (free page reporting), huge pages come from that returned memory and
their first touch faults it in again: ~8 s of kernel time per GiB measured on the 2-core test VMs,
against ~0.4 s on recycled 4 KiB pages, paid at every node start. The test suite, which starts
nodes by the hundred and measures no transfer speed, sets it (tests/conftest.py).
"""
from __future__ import annotations

import ctypes
import logging
import math
import os
import sys

import torch

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14  # linux/mman.h
HUGE_PAGES_VARIABLE = "RAYPD_KV_HUGE_PAGES"


def huge_pages_wanted() -> bool:
    """Unless the environment says RAYPD_KV_HUGE_PAGES=0 (the module's docstring says why)."""
    return os.environ.get(HUGE_PAGES_VARIABLE, "1").strip() != "0"


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """torch.zeros(shape), placed on huge pages when the tensor is on the host and large."""
    device = torch.device(device)
    nbytes = math.prod(shape) * dtype.itemsize
    if device.type != "cpu" or sys.platform != "linux" or nbytes < HUGE_PAGE or not huge_pages_wanted():
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
