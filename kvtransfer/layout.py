"""PoolLayout: where a registered KV pool and aux buffer live and how they divide into blocks and slots.

The pool is block-major: dimension 0 indexes blocks and each block is one contiguous byte range of
`block_nbytes` (engine/kv_cache.py), so block b starts at `pool_addr + b * block_nbytes`. The aux
buffer is divided the same way along dimension 0 into slots (per-request metadata: first token, ...).
Both must sit on one device so a request's blocks and its aux slot go in one write with one
notification; the notification then proves that all of it landed.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from raypd.kvtransfer.errors import LayoutError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class PoolLayout:
    num_blocks: int
    block_nbytes: int
    aux_slots: int
    aux_slot_nbytes: int
    pool_addr: int
    aux_addr: int
    mem_type: str      # "DRAM" or "VRAM" (NIXL's names)
    device_id: int     # CUDA index for VRAM, 0 for DRAM

    @classmethod
    def from_tensors(cls, pool: torch.Tensor, aux: torch.Tensor) -> PoolLayout:
        for what, t in (("pool", pool), ("aux", aux)):
            if t.dim() < 1 or t.shape[0] == 0 or t.numel() == 0:
                raise LayoutError(f"{what} must have at least one non-empty row along dim 0, got {tuple(t.shape)}")
            if not t.is_contiguous():
                raise LayoutError(f"{what} must be contiguous (one registered region)")
        if pool.device != aux.device:
            raise LayoutError(f"pool ({pool.device}) and aux ({aux.device}) must be on one device")
        is_gpu = pool.device.type != "cpu"
        return cls(num_blocks=pool.shape[0], block_nbytes=pool[0].numel() * pool.element_size(),
                   aux_slots=aux.shape[0], aux_slot_nbytes=aux[0].numel() * aux.element_size(),
                   pool_addr=pool.data_ptr(), aux_addr=aux.data_ptr(),
                   mem_type="VRAM" if is_gpu else "DRAM", device_id=(pool.device.index or 0) if is_gpu else 0)

    def check_peer(self, peer: PoolLayout) -> None:
        """A write pairs one local block with one remote block byte for byte, so sizes must agree."""
        if (peer.block_nbytes, peer.aux_slot_nbytes) != (self.block_nbytes, self.aux_slot_nbytes):
            raise LayoutError(f"layout mismatch: local block/aux-slot bytes {self.block_nbytes}/{self.aux_slot_nbytes},"
                              f" peer {peer.block_nbytes}/{peer.aux_slot_nbytes}")

    def to_wire(self) -> dict:
        return asdict(self)

    @classmethod
    def from_wire(cls, d: object) -> PoolLayout:
        if not isinstance(d, dict) or set(d) != {f for f in cls.__dataclass_fields__}:
            raise LayoutError(f"bad layout record: {d!r:.200}")
        if not all(isinstance(d[k], int) and not isinstance(d[k], bool) and d[k] >= 0
                   for k in d if k != "mem_type") or d["mem_type"] not in ("DRAM", "VRAM"):
            raise LayoutError(f"bad layout record: {d!r:.200}")
        if d["num_blocks"] == 0 or d["block_nbytes"] == 0 or d["aux_slots"] == 0 or d["aux_slot_nbytes"] == 0:
            raise LayoutError(f"empty layout: {d!r:.200}")
        return cls(**d)
