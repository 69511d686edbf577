"""Radix prefix cache over block-aligned token runs.

The tree's edges are whole KV blocks: a node is one block (its `block_size` token ids and the pool
block holding their KV), children are keyed by their block's token tuple. A path from the root is a
cached prefix. Locks are counted on the whole path to the root, so an unlocked node has an
unlocked subtree and is evictable; eviction takes unlocked leaves in LRU order (logical clock, ties
by creation order). Every change is published as a KV event with a per-cache sequence number.

The tree holds one allocator reference on each stored block; requests add their own.

With lower tiers (kv_tiers.py), an evicted block is written down first (write-back), or a block is
written down once matched often enough while the tree still holds it (write-through-selective);
match_and_load continues a match past the tree into the blocks a tier holds, loading each into a
newly allocated pool block that joins the tree like any stored block (a BlockStored event). The
cache and its tiers publish through one numbered event log (kv_event_log.py).
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from raypd.engine.cache.block_allocator import BlockAllocator
from raypd.engine.cache.kv_event_log import KVEventLog
from raypd.protocol.block_hash import ROOT_HASH, block_hash
from raypd.protocol.kv_events import BlockStored, KVEventCallback


@dataclass(eq=False, slots=True)
class RadixNode:
    tokens: tuple[int, ...]
    block: int
    hash: int
    parent: RadixNode | None
    uid: int
    children: dict[tuple[int, ...], RadixNode] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0
    hits: int = 0  # times matched (write-through-selective writes a block down at the N-th)

    def __lt__(self, other: RadixNode) -> bool:
        return (self.last_access, self.uid) < (other.last_access, other.uid)

    @property
    def up(self) -> RadixNode:
        """The parent of a node below the root (every node but the root has one)."""
        assert self.parent is not None, "the radix root has no parent"
        return self.parent


class LowerTier(Protocol):
    """Where blocks go below the pool and come back from, by chained block hash (kv_tiers.KVTiers)."""
    evict_writes: bool               # write a block down when the tree evicts it
    write_through_hits: int | None   # write a block down at its N-th match (None: never)

    def held_run(self, parent_hash: int, keys: Sequence[tuple[int, ...]]) -> list[tuple[int, tuple[int, ...]]]: ...

    def store_blocks(self, blocks: Sequence[tuple[int, int, tuple[int, ...], int]]) -> None: ...

    def load(self, block_hash: int, parent_hash: int, tokens: tuple[int, ...], block: int) -> bool: ...

    def snapshot(self, seq: int) -> list[BlockStored]: ...


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    node: RadixNode  # deepest matched node (the root when nothing matched)
    blocks: list[int]  # pool block ids of the matched prefix, in order

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)


class RadixCache:
    def __init__(self, allocator: BlockAllocator, block_size: int, on_event: KVEventCallback | None = None,
                 lower: LowerTier | None = None, events: KVEventLog | None = None):
        """`events`: the node's event log when tiers share it; else one publishing to on_event."""
        self.allocator = allocator
        self.lower = lower
        self.block_size = block_size
        self.events = events if events is not None else KVEventLog(on_event)
        self._uids = itertools.count()
        self.root = RadixNode(tokens=(), block=-1, hash=ROOT_HASH, parent=None, uid=next(self._uids))
        self.root.lock_ref = 1  # never evicted
        self._clock = 0
        self.num_cached_blocks = 0
        self.num_evictable_blocks = 0
        self.num_evicted_blocks = 0  # lifetime total, for stats

    # -- lookup ---------------------------------------------------------------------------------
    def match_prefix(self, token_ids: Sequence[int], max_blocks: int | None = None) -> PrefixMatch:
        """Longest cached run of whole blocks that prefixes `token_ids` (at most `max_blocks`)."""
        self._clock += 1
        node, blocks = self.root, []
        limit = len(token_ids) // self.block_size
        if max_blocks is not None:
            limit = min(limit, max_blocks)
        for i in range(limit):
            key = tuple(token_ids[i * self.block_size:(i + 1) * self.block_size])
            child = node.children.get(key)
            if child is None:
                break
            node = child
            node.last_access = self._clock
            blocks.append(node.block)
        if self.lower is not None and self.lower.write_through_hits is not None and blocks:
            self._write_through(node, self.lower.write_through_hits)
        return PrefixMatch(node=node, blocks=blocks)

    def _write_through(self, node: RadixNode, hits: int) -> None:
        """Count a match on every block of the path ending at `node`; write the ones that reach
        `hits` down to the tier (they stay in the tree)."""
        due = []
        while node is not self.root:
            node.hits += 1
            if node.hits == hits:
                due.append((node.hash, node.up.hash, node.tokens, node.block))
            node = node.up
        if due:
            assert self.lower is not None
            self.lower.store_blocks(due[::-1])  # parents first

    def match_and_load(self, token_ids: Sequence[int], max_blocks: int | None = None) -> PrefixMatch:
        """match_prefix, continued into the lower tier: each following block the tier holds is loaded
        into a new pool block and stored in the tree, until one is missing, fails its checks, or no
        pool block can be freed for it."""
        m = self.match_prefix(token_ids, max_blocks)
        if self.lower is None:
            return m
        limit = len(token_ids) // self.block_size if max_blocks is None else min(len(token_ids) // self.block_size,
                                                                                 max_blocks)
        node, blocks, loaded = m.node, list(m.blocks), []
        keys = [tuple(token_ids[i * self.block_size:(i + 1) * self.block_size]) for i in range(len(blocks), limit)]
        names = self.lower.held_run(node.hash, keys) if keys else []  # the run of following blocks a tier holds
        if not names:
            return m
        self.lock(node)  # the matched path must survive the evictions that make room below
        try:
            if len(names) > self.allocator.num_free:  # one eviction pass for the whole run
                self.evict(len(names) - self.allocator.num_free)
            for name, key in names[:self.allocator.num_free]:
                (block,) = self.allocator.allocate(1)  # the tree's own reference
                if not self.lower.load(name, node.hash, key, block):
                    self.allocator.decref([block])
                    break
                child = RadixNode(tokens=key, block=block, hash=name, parent=node, uid=next(self._uids),
                                  last_access=self._clock)
                node.children[key] = child
                self.num_cached_blocks += 1
                self.num_evictable_blocks += 1
                self.lock(child)  # move our lock down to the new end of the path
                self.unlock(node)
                node = child
                blocks.append(block)
                loaded.append(child)
        finally:
            self.unlock(node)
        if loaded:
            self.events.stored(loaded[0].up.hash, (x.hash for x in loaded), (t for x in loaded for t in x.tokens),
                               self.block_size)
        return PrefixMatch(node=node, blocks=blocks)

    # -- locking --------------------------------------------------------------------------------
    def lock(self, node: RadixNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.num_evictable_blocks -= 1
            node.lock_ref += 1
            node = node.up

    def unlock(self, node: RadixNode) -> None:
        while node is not self.root:
            if node.lock_ref <= 0:
                raise AssertionError("unlock of an unlocked radix node")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.num_evictable_blocks += 1
            node = node.up

    # -- insertion ------------------------------------------------------------------------------
    def insert(self, token_ids: Sequence[int], blocks: Sequence[int]) -> tuple[RadixNode, list[int]]:
        """Store the full blocks of `token_ids` whose KV sits in `blocks`.

        Returns the deepest node and the canonical block id of each stored position: where the tree
        already held that prefix, its own block is canonical and the caller's copy is a duplicate
        that the caller should release.
        """
        self._clock += 1
        n = min(len(token_ids) // self.block_size, len(blocks))
        node, canonical = self.root, []
        new_nodes: list[RadixNode] = []
        for i in range(n):
            key = tuple(token_ids[i * self.block_size:(i + 1) * self.block_size])
            child = node.children.get(key)
            if child is None:
                child = RadixNode(tokens=key, block=blocks[i], hash=block_hash(node.hash, key),
                                  parent=node, uid=next(self._uids))
                node.children[key] = child
                self.allocator.incref([blocks[i]])
                self.num_cached_blocks += 1
                self.num_evictable_blocks += 1
                new_nodes.append(child)
            child.last_access = self._clock
            canonical.append(child.block)
            node = child
        if new_nodes:
            self.events.stored(new_nodes[0].up.hash, (x.hash for x in new_nodes),
                               (t for x in new_nodes for t in x.tokens), self.block_size)
        return node, canonical

    # -- eviction -------------------------------------------------------------------------------
    def evict(self, num_blocks: int) -> int:
        """Free up to `num_blocks` blocks from unlocked leaves, least recently used first."""
        leaves = [x for x in self._iter_nodes() if not x.children and x.lock_ref == 0]
        heapq.heapify(leaves)
        removed: list[RadixNode] = []
        while leaves and len(removed) < num_blocks:
            leaf = heapq.heappop(leaves)
            parent = leaf.up
            del parent.children[leaf.tokens]
            self.num_cached_blocks -= 1
            self.num_evictable_blocks -= 1
            removed.append(leaf)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(leaves, parent)
        self.num_evicted_blocks += len(removed)
        if removed:
            self.events.removed(x.hash for x in removed)
            if self.lower is not None and self.lower.evict_writes:  # write-back, while the KV is still there
                self.lower.store_blocks([(x.hash, x.up.hash, x.tokens, x.block) for x in removed])
            self.allocator.decref([x.block for x in removed])
        return len(removed)

    def reset(self) -> None:
        """Drop every unlocked block; refuses while requests hold locks."""
        if any(x.lock_ref for x in self._iter_nodes()):
            raise RuntimeError("cannot reset the prefix cache while requests hold parts of it")
        for x in self._iter_nodes():
            self.allocator.decref([x.block])
        self.root.children.clear()
        self.num_cached_blocks = self.num_evictable_blocks = 0
        self.events.cleared()

    def snapshot(self) -> tuple[int, list[BlockStored]]:
        """(last event seq, one BlockStored per cached block, parents before children): what a
        consumer that lost events needs to rebuild its view of this cache."""
        seq = self.events.seq
        events, stack = [], list(self.root.children.values())
        while stack:
            x = stack.pop()
            events.append(BlockStored(seq=seq, parent_hash=x.up.hash, block_hashes=(x.hash,),
                                      token_ids=x.tokens, block_size=self.block_size))
            stack.extend(x.children.values())
        if self.lower is not None:
            events += self.lower.snapshot(seq)
        return seq, events

    def cached_blocks(self) -> set[int]:
        return {x.block for x in self._iter_nodes()}

    # -- internals ------------------------------------------------------------------------------
    def _iter_nodes(self) -> Iterator[RadixNode]:
        """Every node below the root."""
        stack = list(self.root.children.values())
        while stack:
            x = stack.pop()
            yield x
            stack.extend(x.children.values())

    @property
    def event_seq(self) -> int:
        """The sequence number of the last KV event this cache (or a tier below it) published."""
        return self.events.seq
