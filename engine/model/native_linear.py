"""Projections on narrow weights (bfloat16; int8 with a scale per output row, or per group of 32
columns with an offset: quantization.py) through the C kernel in csrc/narrow_linear.c, via ctypes.

Why: at one or a few rows per step a CPU projection is bound by how fast its weights stream from
memory, so halving (bf16) or quartering (int8) the bytes per weight is what speeds a decode step up;
the kernel widens each weight to float32 in registers and accumulates in float32. Activations stay
in the engine's dtype (float32 or bfloat16). The weights are packed once: rows padded to a multiple
of 4 and columns to a multiple of 16 with zeros (the kernel has no ragged edges), tile by tile.
"""
from __future__ import annotations

import ctypes
from functools import lru_cache
from typing import Literal

import torch
import torch.nn.functional as F

from raypd.engine.model import native_build
from raypd.engine.model.quantization import GROUP, quantize_int8, quantize_int8_groups

WeightFormat = Literal["float32", "bfloat16", "int8", "int8-g32"]
_KIND = {"float32": 0, "bfloat16": 1, "int8": 2, "int8-g32": 2}
_STORAGE = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.int8, "int8-g32": torch.int8}
ROW_MULTIPLE, COL_MULTIPLE = 4, 16  # the kernel's NR and int16 vector width
BF16_ORDER = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]


class _Packed(ctypes.Structure):
    """The kernel's narrow_linear struct, field for field."""
    _fields_ = [("weight", ctypes.c_void_p), ("scale", ctypes.c_void_p), ("bias", ctypes.c_void_p),
                ("n", ctypes.c_int64), ("k", ctypes.c_int64), ("n_padded", ctypes.c_int64),
                ("k_padded", ctypes.c_int64), ("weight_kind", ctypes.c_int32), ("activation_bf16", ctypes.c_int32),
                ("group_scale", ctypes.c_void_p), ("group_offset", ctypes.c_void_p), ("groups", ctypes.c_int64)]


class NativeLinear:
    """y = x @ W.T (+ b) with W stored as `fmt`, x and y in `activation_dtype` (float32 or bfloat16)."""
    packed = False  # not oneDNN's packing (linear.py's PackedLinear)

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, fmt: WeightFormat,
                 activation_dtype: torch.dtype, num_threads: int, extra_flags: tuple[str, ...] = ()):
        """extra_flags: compiler flags for this kernel's build (tests build the portable variant)."""
        if activation_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"the narrow-weight kernel takes float32 or bfloat16 activations, not {activation_dtype}")
        self._fn = _load_library(extra_flags).raypd_narrow_linear
        self.out_features, self.in_features = n, k = weight.shape
        self.format = fmt
        self.activation_dtype = activation_dtype
        self.num_threads = max(1, num_threads)
        w = weight.detach().to("cpu", torch.float32)
        cols = GROUP if fmt == "int8-g32" else COL_MULTIPLE
        n_padded, k_padded = -(-n // ROW_MULTIPLE) * ROW_MULTIPLE, -(-k // cols) * cols
        self.scale: torch.Tensor | None = None
        self.group_scale: torch.Tensor | None = None
        self.group_offset: torch.Tensor | None = None
        if fmt == "int8":
            q, self.scale = quantize_int8(w)
            w = q
        elif fmt == "int8-g32":
            q, scale, offset = quantize_int8_groups(F.pad(w, (0, k_padded - k, 0, n_padded - n)))
            w = q
            # Scales tile by tile, [n/4][groups][4], so a tile reads its rows' scales in one stream.
            self.group_scale = scale.view(n_padded // ROW_MULTIPLE, ROW_MULTIPLE, -1).transpose(1, 2).contiguous()
            self.group_offset = offset
        padded = torch.zeros(n_padded, k_padded, dtype=_STORAGE[fmt])
        padded[:n, :k] = w[:n, :k].to(_STORAGE[fmt])
        if fmt == "bfloat16":  # columns 0-3, 8-11, 4-7, 12-15 of each 16 (narrow_linear.c, bf16_slot)
            padded = padded.view(n_padded, -1, COL_MULTIPLE)[:, :, BF16_ORDER].reshape(n_padded, k_padded)
        # Tile by tile, [n/4][k/16][4][16]: a tile's weights are one sequential stream (narrow_linear.c).
        self.weight = padded.view(n_padded // ROW_MULTIPLE, ROW_MULTIPLE, k_padded // COL_MULTIPLE, COL_MULTIPLE) \
            .transpose(1, 2).contiguous()
        self.bias = None if bias is None else bias.detach().to("cpu", torch.float32).contiguous()
        self._packed = _Packed(self.weight.data_ptr(), _ptr(self.scale), _ptr(self.bias), n, k, n_padded,
                               k_padded, _KIND[fmt], int(activation_dtype == torch.bfloat16),
                               _ptr(self.group_scale), _ptr(self.group_offset),
                               k_padded // GROUP if fmt == "int8-g32" else 0)
        self._packed_ptr = ctypes.addressof(self._packed)

    @property
    def packed_address(self) -> int:
        """Address of the kernel's struct for this projection (native_decoder.py passes it on)."""
        return self._packed_ptr

    @property
    def nbytes(self) -> int:
        """Bytes one pass over the weights reads (what a decode step streams)."""
        parts = (self.weight, self.scale, self.bias, self.group_scale, self.group_offset)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.activation_dtype:
            raise TypeError(f"expected {self.activation_dtype} activations, got {x.dtype}")
        x = x.contiguous()
        rows = x.numel() // self.in_features
        y = torch.empty(*x.shape[:-1], self.out_features, dtype=x.dtype)
        rc = self._fn(self._packed_ptr, x.data_ptr(), y.data_ptr(), rows, self.num_threads)
        if rc != 0:
            raise MemoryError(f"the narrow-weight kernel failed with code {rc}")
        return y


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


@lru_cache(maxsize=None)
def _load_library(extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    lib = native_build.load("narrow_linear.c", extra_flags)
    lib.raypd_narrow_linear.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    lib.raypd_narrow_linear.restype = ctypes.c_int
    return lib
