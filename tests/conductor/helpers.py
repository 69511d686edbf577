"""Builders shared by the conductor tests: hosts, KV events with real engine hashes, load reports."""
from __future__ import annotations

from raypd.protocol.block_hash import ROOT_HASH, chained_block_hashes
from raypd.protocol.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVTier
from raypd.protocol.messages import HostInfo, KVEventBatch, LoadReport

BS = 4  # small blocks keep token lists readable


def host(node_id: str = "ray-node-0") -> HostInfo:
    return HostInfo(node_id=node_id, ip="10.0.0.1", hostname=node_id, pid=1)


class EventMaker:
    """Emits one node's events with consecutive sequence numbers, like engine.radix_cache."""

    def __init__(self, block_size: int = BS):
        self.seq = 0
        self.block_size = block_size

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def stored(self, tokens: list[int], parent_tokens: list[int] | None = None,
               tier: KVTier = KVTier.POOL) -> BlockStored:
        """Blocks of `tokens` stored in `tier` on top of the blocks of `parent_tokens` (none: at the root)."""
        parent = ROOT_HASH
        if parent_tokens:
            parent = chained_block_hashes(parent_tokens, self.block_size)[-1]
        hashes = chained_block_hashes(tokens, self.block_size, parent)
        n = len(hashes) * self.block_size
        return BlockStored(self._next(), parent, tuple(hashes), tuple(tokens[:n]), self.block_size, tier)

    def removed(self, hashes: list[int], tier: KVTier = KVTier.POOL) -> BlockRemoved:
        return BlockRemoved(self._next(), tuple(hashes), tier)

    def cleared(self) -> AllBlocksCleared:
        return AllBlocksCleared(self._next())


def batch(node: str, *events) -> KVEventBatch:
    return KVEventBatch(node, tuple(events))


def load(node: str, role: str = "prefill", queued: int = 0, speed: float = 1000.0, running: int = 0,
         free_blocks: int = 1000, total_blocks: int = 1000, step_time_s: float = 0.0,
         timestamp: float = 0.0, kv_bytes_per_token: int = 0,
         tier_rates: dict[int, float] | None = None) -> LoadReport:
    return LoadReport(node_name=node, role=role, queued_prefill_tokens=queued, waiting=0, running=running,
                      free_blocks=free_blocks, total_blocks=total_blocks, cached_blocks=0,
                      step_time_s=step_time_s, prefill_tokens_per_s=speed, timestamp=timestamp,
                      kv_bytes_per_token=kv_bytes_per_token, tier_load_bytes_per_s=dict(tier_rates or {}))


class FakeClock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt
