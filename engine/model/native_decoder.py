"""Every decoder layer of a decode-only step in one C call (csrc/decoder_layers.c), via ctypes.

Why: at one request per step, a layer on the torch path is ~50 small ops around 4 projections, and
on a small CPU those ops cost more than streaming the layer's int8 weights (docs/benchmarks.md).
The C loop computes what llama.py's layer loop computes, in the engine's dtype, through the same
projection kernel (native_linear.py) and decode-attention kernel (native_attention.py). It serves
steps whose every token is a decode on the native attention path; anything else (prefill chunks,
mixed steps, the torch path) goes through llama.py's loop as before. With row-split projections
(linear.py) it takes their C-kernel half, and only steps of fewer rows than they leave the kernel at:
a bigger batch runs faster through the loop on oneDNN's bf16 GEMM.
"""
from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Sequence
from functools import lru_cache
from typing import Protocol

import torch

from raypd.engine.cache.kv_cache import PagedKVCache
from raypd.engine.model import native_build
from raypd.engine.model.attention import AttentionMetadata
from raypd.engine.model.config import ModelConfig
from raypd.engine.model.linear import RowSplitLinear, narrow_kernel
from raypd.engine.model.native_build import KernelUnavailable
from raypd.engine.model.native_linear import NativeLinear

_VOID, _I64 = ctypes.c_void_p, ctypes.c_int64
LAYER_FIELDS = ("input_norm", "qkv", "o", "post_norm", "gate_up", "down")


class DecoderLayer(Protocol):
    """What llama.py's layers hold (its _Layer)."""
    @property
    def input_norm(self) -> torch.Tensor: ...
    @property
    def post_norm(self) -> torch.Tensor: ...
    @property
    def qkv(self) -> object: ...
    @property
    def o(self) -> object: ...
    @property
    def gate_up(self) -> object: ...
    @property
    def down(self) -> object: ...


class _Layer(ctypes.Structure):
    """The kernel's decoder_layer struct, field for field."""
    _fields_ = [("input_norm", _VOID), ("post_norm", _VOID), ("qkv", _VOID), ("o", _VOID), ("gate_up", _VOID),
                ("down", _VOID)]


class _Decoder(ctypes.Structure):
    """The kernel's decoder struct, field for field."""
    _fields_ = [("layers", _VOID), ("num_layers", _I64), ("hidden", _I64), ("heads", _I64), ("kv_heads", _I64),
                ("head_dim", _I64), ("intermediate", _I64), ("eps", ctypes.c_float), ("bf16", ctypes.c_int32)]


class NativeDecoder:
    """decoder(h, cos, sin, kv, meta) runs every layer over a decode-only step's hidden states."""

    def __init__(self, cfg: ModelConfig, input_norms: Sequence[torch.Tensor], post_norms: Sequence[torch.Tensor],
                 projections: Sequence[tuple[NativeLinear, NativeLinear, NativeLinear, NativeLinear]],
                 dtype: torch.dtype, num_threads: int, max_rows: int | None = None):
        """projections: (qkv, o, gate_up, down) per layer; norms in `dtype`; max_rows: the most
        sequences a step may have for this decoder to serve it (None: any)."""
        self._fn = _load_library().raypd_decode_layers
        self.dtype = dtype
        self.max_rows = max_rows
        self.num_threads = max(1, num_threads)
        # The structs point into these tensors and the projections' own structs: keep them alive.
        self._keep = [*input_norms, *post_norms, *projections]
        self._layers = (_Layer * cfg.num_layers)(*[
            _Layer(inp.data_ptr(), post.data_ptr(), *(p.packed_address for p in ps))
            for inp, post, ps in zip(input_norms, post_norms, projections, strict=True)])
        self._decoder = _Decoder(ctypes.addressof(self._layers), cfg.num_layers, cfg.hidden_size, cfg.num_heads,
                                 cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size, cfg.rms_norm_eps,
                                 int(dtype == torch.bfloat16))
        self._address = ctypes.addressof(self._decoder)

    @classmethod
    def for_layers(cls, cfg: ModelConfig, layers: Sequence[DecoderLayer], dtype: torch.dtype,
                   num_threads: int) -> NativeDecoder | str:
        """The decoder for llama.py's layers, or why they cannot run here. A layer carrying anything
        else (a weight this C loop does not know, such as a q/k norm) is refused, not skipped."""
        for layer in layers:
            if not dataclasses.is_dataclass(layer):
                return f"cannot tell what a {type(layer).__name__} layer computes"
            extra = [f.name for f in dataclasses.fields(layer)
                     if f.name not in LAYER_FIELDS and getattr(layer, f.name) is not None]
            if extra:
                return f"the layers carry {extra}, which the fused decode layers do not compute"
        projections = [(layer.qkv, layer.o, layer.gate_up, layer.down) for layer in layers]
        why_not = cls.unavailable(cfg, projections, dtype)
        if why_not is not None:
            return why_not
        native = [tuple(narrow_kernel(p) for p in ps) for ps in projections]
        splits = [p.min_rows for ps in projections for p in ps if isinstance(p, RowSplitLinear)]
        return cls(cfg, [layer.input_norm for layer in layers], [layer.post_norm for layer in layers],
                   native, dtype, num_threads, min(splits) - 1 if splits else None)  # type: ignore[arg-type]

    @staticmethod
    def unavailable(cfg: ModelConfig, projections: Sequence[Sequence[object]], dtype: torch.dtype) -> str | None:
        """None when these projections (qkv, o, gate_up, down per layer) can run here, else why not."""
        if dtype not in (torch.float32, torch.bfloat16):
            return f"no fused decode layers in {dtype}"
        kernels = [narrow_kernel(p) for ps in projections for p in ps]
        if not all(k is not None and k.activation_dtype == dtype for k in kernels):
            return f"the projections are not all on the narrow-weight kernel with {dtype} activations"
        if cfg.num_heads % cfg.num_kv_heads or cfg.num_heads // cfg.num_kv_heads > 16 or cfg.head_dim > 256:
            return "the attention shape is outside the decode kernel's limits"
        try:
            _load_library()
        except KernelUnavailable as e:
            return str(e)
        return None

    @staticmethod
    def serves(meta: AttentionMetadata) -> bool:
        """True for a step of decode tokens only, in batch order, on the native attention path."""
        return not meta.prefills and meta.decode is not None and meta.decode.tables is not None

    def fits(self, rows: int) -> bool:
        """True when a decode step of `rows` sequences is this decoder's to run (max_rows)."""
        return self.max_rows is None or rows <= self.max_rows

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: PagedKVCache,
                 meta: AttentionMetadata) -> torch.Tensor:
        """h: [D, hidden] after the embedding, updated in place and returned; cos, sin: [D, 1, head_dim]."""
        d = meta.decode
        assert d is not None and d.tables is not None and d.ctx_lens is not None and not meta.prefills
        if kv.pool.dtype != self.dtype or h.dtype != self.dtype:
            raise TypeError(f"the decoder runs in {self.dtype}, got h {h.dtype} and a {kv.pool.dtype} pool")
        h, cos, sin = h.contiguous(), cos.contiguous(), sin.contiguous()
        tables = d.tables.contiguous()
        rc = self._fn(self._address, h.data_ptr(), cos.data_ptr(), sin.data_ptr(), kv.pool.data_ptr(),
                      meta.write_slots.data_ptr(), tables.data_ptr(), d.ctx_lens.data_ptr(), h.shape[0],
                      tables.shape[1], kv.block_size, kv.runs_per_block, self.num_threads)
        if rc != 0:
            raise RuntimeError(f"the fused decode layers failed with code {rc}")
        return h


@lru_cache(maxsize=1)
def _load_library() -> ctypes.CDLL:
    lib = native_build.load("decoder_layers.c")
    lib.raypd_decode_layers.argtypes = [_VOID] * 8 + [_I64] * 4 + [ctypes.c_int]
    lib.raypd_decode_layers.restype = ctypes.c_int
    return lib
