"""The aux record a prefill node writes beside a request's KV, and the pool of slots holding them.

One slot per room in flight: int64[AUX_WIDTH] = (first sampled token, prompt tokens the prefill node
served from its cache, prompt length, the room, a magic number). The magic tells a written record
from a zeroed slot; the room and the length tell this request's record from another's: a late write
into a slot the decode side has since handed to another room must never give that request another
request's first token (and, with it, KV it must not trust).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

AUX_WIDTH = 5
AUX_MAGIC = 0x7261797064  # "raypd"


@dataclass(frozen=True, slots=True)
class AuxRecord:
    first_token: int
    num_cached_tokens: int
    num_prompt_tokens: int
    room: int = 0          # the room the record was written for (rooms are 63-bit: an int64 holds one)


class AuxSlots:
    def __init__(self, num_slots: int, device: str | torch.device = "cpu"):
        import torch  # here: the node classes import this module wherever a node's handle goes

        self.buffer = torch.zeros(num_slots, AUX_WIDTH, dtype=torch.int64, device=device)
        self._free = list(range(num_slots - 1, -1, -1))

    def take(self) -> int | None:
        return self._free.pop() if self._free else None

    def give_back(self, slot: int) -> None:
        self.buffer[slot].zero_()
        self._free.append(slot)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def write(self, slot: int, rec: AuxRecord) -> None:
        self.buffer[slot] = self.buffer.new_tensor([rec.first_token, rec.num_cached_tokens, rec.num_prompt_tokens,
                                                     rec.room, AUX_MAGIC])

    def read(self, slot: int) -> AuxRecord | None:
        first, cached, n, room, magic = self.buffer[slot].tolist()
        if magic != AUX_MAGIC:
            return None
        return AuxRecord(first, cached, n, room)
