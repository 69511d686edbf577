"""What the kernel tests need of the CPU path they run on (engine/model/cpu_paths.py)."""
from __future__ import annotations

import pytest
import torch

from raypd.engine.model import cpu_paths
from raypd.engine.model.linear import packing_unavailable


def require_bf16_packing() -> None:
    """Row-split projections exist only where oneDNN has a bf16 linear (AVX-512 BW/VL/DQ or
    AVX-NE-CONVERT, and a process not held below them): elsewhere the test names what is missing."""
    why_not = packing_unavailable(torch.device("cpu"), torch.bfloat16)
    if why_not is not None:
        pytest.skip(f"no row-split projections on this CPU path ({cpu_paths.held().name}): {why_not}")
