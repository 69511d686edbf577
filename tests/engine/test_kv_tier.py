"""The KV tiers below the pool (engine/cache/kv_tiers.py over host_kv_tier.py and kv_tier.py): evicted
blocks written back to host memory and a directory, loaded on a prefix match that runs past the
pool, and never used unless every check passes."""
from __future__ import annotations

import pytest
import torch

from raypd.engine import LLM, SamplingParams
from raypd.engine.cache.block_allocator import BlockAllocator
from raypd.engine.cache.host_kv_tier import HostKVTier
from raypd.engine.cache.kv_event_log import KVEventLog
from raypd.engine.cache.kv_tier import DiskKVTier
from raypd.engine.cache.kv_tiers import KVTiers
from raypd.engine.cache.radix_cache import RadixCache
from raypd.protocol.block_hash import ROOT_HASH, block_hash
from raypd.protocol.kv_events import BlockRemoved, BlockStored, KVTier
from tests.conftest import NEW_TOKENS, hf_greedy
from tests.tiny_model import TINY

BS = 4
TOKENS = (1, 2, 3, 4)


def pool(dtype=torch.float32, blocks: int = 8) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(blocks, 2, 2, 2, BS, 8).to(dtype)  # [blocks, layers, K/V, kv heads, slots, dim]


def test_a_block_goes_down_and_comes_back_bit_for_bit(tmp_path):
    p = pool()
    tier = DiskKVTier(tmp_path, 1 << 20, p)
    h = block_hash(ROOT_HASH, TOKENS)
    assert tier.put(h, ROOT_HASH, TOKENS, p[3])
    assert h in tier and tier.stats.stored == 1 and not any(tmp_path.glob("*.tmp*"))
    assert tier.read_into(h, ROOT_HASH, TOKENS, p[5])
    assert torch.equal(p[5], p[3]) and tier.stats.loaded == 1


@pytest.mark.parametrize("damage", ["flipped payload byte", "truncated", "other tokens", "empty"])
def test_a_damaged_file_is_rejected_deleted_and_never_copied(tmp_path, damage):
    p = pool()
    tier = DiskKVTier(tmp_path, 1 << 20, p)
    h = block_hash(ROOT_HASH, TOKENS)
    tier.put(h, ROOT_HASH, TOKENS, p[3])
    (path,) = tmp_path.glob("*.kv")
    data = bytearray(path.read_bytes())
    if damage == "flipped payload byte":
        data[-10] ^= 0x40
    elif damage == "truncated":
        data = data[:len(data) // 2]
    elif damage == "empty":
        data = bytearray()
    path.write_bytes(bytes(data))
    before = p[5].clone()
    tokens = (9, 9, 9, 9) if damage == "other tokens" else TOKENS
    assert not tier.read_into(h, ROOT_HASH, tokens, p[5])
    assert torch.equal(p[5], before)  # nothing of the file reached the pool
    assert tier.stats.rejected == 1 and h not in tier and not path.exists()


def test_another_layout_adopts_nothing_and_a_restart_keeps_its_own(tmp_path):
    p = pool()
    tier = DiskKVTier(tmp_path, 1 << 20, p)
    hashes = [block_hash(ROOT_HASH, (i, i, i, i)) for i in range(3)]
    for i, h in enumerate(hashes):
        tier.put(h, ROOT_HASH, (i, i, i, i), p[i])
    (tmp_path / "stray.tmp123").write_bytes(b"half a block")
    again = DiskKVTier(tmp_path, 1 << 20, pool())  # the same node, restarted
    assert [h in again for h in hashes] == [True] * 3
    assert again.entry(hashes[2]) == (ROOT_HASH, (2, 2, 2, 2))  # what a re-sync snapshot needs
    assert again.read_into(hashes[1], ROOT_HASH, (1, 1, 1, 1), p[7]) and torch.equal(p[7], p[1])
    assert not (tmp_path / "stray.tmp123").exists()
    foreign = DiskKVTier(tmp_path, 1 << 20, pool(torch.bfloat16))  # another dtype: another layout
    assert foreign.num_blocks == 0 and not any(tmp_path.iterdir())


def test_the_stack_never_holds_more_than_a_tier_size_dropping_the_least_recently_used(tmp_path):
    p = pool()
    one = DiskKVTier(tmp_path / "probe", 1 << 20, p).file_bytes
    events: list = []
    disk = DiskKVTier(tmp_path / "t", 3 * one, p)
    tiers = KVTiers(p, [disk], KVEventLog(events.append))
    keys = [(i, 0, 0, 0) for i in range(5)]
    hashes = [block_hash(ROOT_HASH, k) for k in keys]
    tiers.store_blocks([(hashes[i], ROOT_HASH, keys[i], i) for i in range(3)])
    assert tiers.load(hashes[0], ROOT_HASH, keys[0], 6)  # 0 is now the most recently used
    tiers.store_blocks([(hashes[i], ROOT_HASH, keys[i], i) for i in range(3, 5)])
    assert [h in disk for h in hashes] == [True, False, False, True, True]
    assert sum(f.stat().st_size for f in (tmp_path / "t").iterdir()) <= 3 * one and disk.stats.evicted == 2
    removed = [e for e in events if isinstance(e, BlockRemoved)]
    assert [(e.block_hashes, e.tier) for e in removed] == [((hashes[1],), KVTier.DISK), ((hashes[2],), KVTier.DISK)]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))  # one gap-free sequence


def test_host_full_moves_its_oldest_block_down_to_disk_bit_for_bit(tmp_path):
    p = pool()
    block_bytes = p[0].numel() * p.element_size()
    events: list = []
    host = HostKVTier(2 * block_bytes, p)
    disk = DiskKVTier(tmp_path, 1 << 20, p)
    tiers = KVTiers(p, [host, disk], KVEventLog(events.append))
    keys = [(i, 1, 1, 1) for i in range(3)]
    hashes = [block_hash(ROOT_HASH, k) for k in keys]
    originals = [p[i].clone() for i in range(3)]
    tiers.store_blocks([(hashes[i], ROOT_HASH, keys[i], i) for i in range(3)])
    assert [h in host for h in hashes] == [False, True, True] and hashes[0] in disk and host.num_blocks == 2
    assert [(type(e).__name__, e.block_hashes, e.tier) for e in events] == [
        ("BlockStored", (hashes[0],), KVTier.HOST), ("BlockStored", (hashes[1],), KVTier.HOST),
        ("BlockStored", (hashes[0],), KVTier.DISK), ("BlockRemoved", (hashes[0],), KVTier.HOST),
        ("BlockStored", (hashes[2],), KVTier.HOST)]
    p[3:6] = 0
    for i in range(3):  # block 0 from disk, blocks 1 and 2 from host memory
        assert tiers.load(hashes[i], ROOT_HASH, keys[i], 3 + i) and torch.equal(p[3 + i], originals[i])
    assert (host.stats.loaded, disk.stats.loaded) == (2, 1)
    snap = tiers.snapshot(seq=9)
    assert sorted((e.block_hashes[0], e.tier) for e in snap) == sorted(
        [(hashes[0], KVTier.DISK), (hashes[1], KVTier.HOST), (hashes[2], KVTier.HOST)])
    stats = tiers.stats()
    assert stats["kv_tier_host_stored"] == 3 and stats["kv_tier_disk_stored"] == 1 and stats["kv_tier_host_evicted"] == 1
    assert set(tiers.load_rates()) == {KVTier.HOST, KVTier.DISK} and tiers.load_rates()[KVTier.DISK] > 0


def test_a_rejected_disk_block_is_dropped_with_an_event_and_computed_instead(tmp_path):
    p = pool()
    events: list = []
    disk = DiskKVTier(tmp_path, 1 << 20, p)
    tiers = KVTiers(p, [disk], KVEventLog(events.append))
    h = block_hash(ROOT_HASH, TOKENS)
    tiers.store_blocks([(h, ROOT_HASH, TOKENS, 3)])
    (path,) = tmp_path.glob("*.kv")
    path.write_bytes(path.read_bytes()[:-1] + b"\x00")
    assert not tiers.load(h, ROOT_HASH, TOKENS, 5)
    assert h not in tiers and isinstance(events[-1], BlockRemoved) and events[-1].tier == KVTier.DISK


def test_write_through_selective_writes_a_block_at_its_nth_match_and_evictions_write_nothing(tmp_path):
    p = pool()
    alloc = BlockAllocator(8)
    events: list = []
    log = KVEventLog(events.append)
    host = HostKVTier(8 * p[0].numel() * p.element_size(), p)
    tiers = KVTiers(p, [host], log, policy="write-through-selective", write_through_hits=2)
    cache = RadixCache(alloc, BS, lower=tiers, events=log)
    hot, cold = list(range(1, 9)), list(range(50, 58))
    for prompt in (hot, cold):
        blocks = alloc.allocate(2)
        cache.insert(prompt, blocks)
        alloc.decref(blocks)
    cache.match_prefix(hot)
    assert host.num_blocks == 0  # one match: not yet
    cache.match_prefix(hot)
    assert host.num_blocks == 2  # the second: both blocks of the path, written while still in the pool
    assert cache.num_cached_blocks == 4
    cache.evict(4)  # write-through: eviction writes nothing, so the cold prompt is gone for good
    assert host.num_blocks == 2 and host.stats.stored == 2
    assert cache.match_and_load(hot).num_blocks == 2 and cache.match_and_load(cold).num_blocks == 0
    assert tiers.lookup_blocks == 4 and host.stats.loaded == 2


def test_the_cache_snapshot_covers_the_pool_and_every_tier(tmp_path):
    p = pool()
    alloc = BlockAllocator(4)
    log = KVEventLog()
    tiers = KVTiers(p, [DiskKVTier(tmp_path, 1 << 20, p)], log)
    cache = RadixCache(alloc, BS, lower=tiers, events=log)
    prompt = list(range(1, 13))
    blocks = alloc.allocate(3)
    cache.insert(prompt, blocks)
    alloc.decref(blocks)
    cache.evict(1)
    seq, events = cache.snapshot()
    assert seq == log.seq == 3  # stored (pool), removed (pool), stored (disk)
    assert sorted((e.tier, len(e.block_hashes)) for e in events) == [(KVTier.POOL, 1), (KVTier.POOL, 1), (KVTier.DISK, 1)]


class ListTier:
    """A lower tier in memory: what the radix cache asks of one."""
    evict_writes = True
    write_through_hits = None

    def __init__(self) -> None:
        self.blocks: dict[int, tuple[int, tuple[int, ...]]] = {}
        self.loaded: list[tuple[int, int]] = []  # (hash, into block)

    def __contains__(self, h: int) -> bool:
        return h in self.blocks

    def held_run(self, parent: int, keys):
        run = []
        for key in keys:
            parent = block_hash(parent, key)
            if parent not in self.blocks:
                break
            run.append((parent, key))
        return run

    def store_blocks(self, blocks) -> None:
        for h, parent, tokens, _ in blocks:
            self.blocks[h] = (parent, tokens)

    def load(self, h: int, parent: int, tokens: tuple[int, ...], block: int) -> bool:
        self.loaded.append((h, block))
        return self.blocks.get(h) == (parent, tokens)

    def snapshot(self, seq: int) -> list:
        return []


def test_the_radix_cache_writes_back_on_eviction_and_loads_past_the_pool():
    alloc = BlockAllocator(4)
    events = []
    lower = ListTier()
    cache = RadixCache(alloc, BS, events.append, lower=lower)
    prompt = list(range(1, 13))  # three blocks
    blocks = alloc.allocate(3)
    cache.insert(prompt, blocks)
    alloc.decref(blocks)  # the request finished: the cache holds them alone
    assert cache.evict(2) == 2  # the last two blocks go down to the tier
    h = [block_hash(ROOT_HASH, prompt[:4])]
    h += [block_hash(h[0], prompt[4:8]), block_hash(block_hash(h[0], prompt[4:8]), prompt[8:12])]
    assert set(lower.blocks) == {h[1], h[2]} and isinstance(events[-1], BlockRemoved)
    m = cache.match_and_load(prompt, 3)
    assert m.num_blocks == 3 and m.blocks[0] == blocks[0]
    assert [x for x, _ in lower.loaded] == [h[1], h[2]] and [b for _, b in lower.loaded] == m.blocks[1:]
    assert isinstance(events[-1], BlockStored) and events[-1].block_hashes == (h[1], h[2])
    assert cache.num_cached_blocks == 3 and cache.num_evictable_blocks == 3  # loaded, cached, unlocked
    assert cache.match_prefix(prompt).num_blocks == 3


def test_a_failed_load_stops_the_prefix_there_and_frees_its_block():
    alloc = BlockAllocator(4)
    lower = ListTier()
    cache = RadixCache(alloc, BS, None, lower=lower)
    prompt = list(range(1, 9))
    lower.blocks[block_hash(ROOT_HASH, prompt[:4])] = (ROOT_HASH, (0, 0, 0, 0))  # a foreign block under that name
    m = cache.match_and_load(prompt, 2)
    assert m.num_blocks == 0 and alloc.num_free == 4 and cache.num_cached_blocks == 0


# The engine tests below are about blocks leaving the pool and coming back, whatever the weights: a tiny
# random Llama (tests/tiny_model.py's, with 4 KV heads of dim 64 in each of its 2 layers) whose 16-token
# block holds 64 KiB of KV, so that a host tier of 1 MiB holds 16 blocks (the smallest size, 1 MiB, holds
# 4096 blocks of tests/tiny_model.py's own); its forward pass takes milliseconds, the default model's seconds.
WIDE_KV = TINY | dict(num_key_value_heads=4, head_dim=64)


@pytest.fixture(scope="module")
def wide_kv_model(tmp_path_factory, prompt_ids) -> tuple[str, list[list[int]]]:
    """(the folder of the tiny wide-KV model, transformers' float32 greedy continuations on it)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from raypd.benchmarks.random_models import copy_tokenizer
    from raypd.engine.model.source import resolve_model

    folder = tmp_path_factory.mktemp("wide-kv-llama")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**WIDE_KV)).eval().save_pretrained(folder)
    copy_tokenizer(resolve_model(None), folder)
    return str(folder), hf_greedy(prompt_ids, "float32", str(folder))


def test_greedy_output_is_transformers_with_prefixes_reloaded_from_the_tiers(make_llm, prompt_ids, wide_kv_model,
                                                                            tmp_path):
    """A pool too small to keep the article's prompts between turns: their prefix goes down to the
    tiers (host memory of 16 blocks in front of the disk: most blocks pass through it to the disk) and
    comes back from both, and every output is still transformers' float32 greedy output."""
    model, reference = wide_kv_model
    llm = make_llm(model=model, num_blocks=36, kv_tier_dir=str(tmp_path), kv_tier_size_mb=256, kv_host_tier_size_mb=1)
    assert llm.engine.kv_cache.pool[0].nbytes == 64 * 2**10  # one block: 16 fit in the host tier's MiB
    greedy = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)
    order = sorted(range(len(prompt_ids)), key=lambda i: -len(prompt_ids[i]))  # long ones first, evicted later
    first = {i: llm.generate([prompt_ids[i]], greedy)[0] for i in order}
    # The second pass in reverse: the prompts the first pass ended with are still in the pool or in
    # host memory, the ones it began with come back from disk.
    second = {i: llm.generate([prompt_ids[i]], greedy)[0] for i in reversed(order)}
    for i in order:
        assert first[i].token_ids == reference[i], f"prompt {i}, first pass"
        assert second[i].token_ids == reference[i], f"prompt {i}, second pass"
    stats = llm.engine.stats()
    assert stats["kv_tier_disk_stored"] > 0 and stats["kv_tier_disk_rejected"] == 0
    assert stats["kv_tier_disk_loaded"] > 0 and stats["kv_tier_host_loaded"] > 0
    assert stats["kv_tier_host_stored"] > 0 and stats["kv_tier_host_evicted"] > 0
    assert stats["kv_tier_lookup_blocks"] >= stats["kv_tier_disk_loaded"] + stats["kv_tier_host_loaded"]
    longest = order[0]  # evicted by the later prompts, reloaded on its second turn
    assert second[longest].num_cached_tokens >= len(prompt_ids[longest]) // 2
    assert sum(f.stat().st_size for f in tmp_path.iterdir()) <= 256 * 2**20


def test_a_restarted_engine_reloads_its_prefix_from_its_disk_tier(make_llm, prompt_ids, wide_kv_model, tmp_path):
    """A restarted node adopts its disk tier: the first turn after the restart reloads the prefix and
    gives transformers' output. (Write-back: what is still only in the pool is lost with the process;
    evicting it all writes it down first.)"""
    model, reference = wide_kv_model
    llm = make_llm(model=model, num_blocks=36, kv_tier_dir=str(tmp_path), kv_tier_size_mb=256)
    greedy = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)
    longest = max(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    before = llm.generate([prompt_ids[longest]], greedy)[0]
    assert before.token_ids == reference[longest]
    llm.engine.prefix_cache.evict(llm.engine.num_blocks)
    restarted = LLM(model, num_blocks=36, kv_tier_dir=str(tmp_path), kv_tier_size_mb=256)
    after = restarted.generate([prompt_ids[longest]], greedy)[0]
    assert after.token_ids == reference[longest]
    assert after.num_cached_tokens >= len(prompt_ids[longest]) // 2
    assert restarted.engine.stats()["kv_tier_disk_loaded"] > 0
    restarted.engine.check_block_integrity()


def test_loading_into_a_full_pool_evicts_least_recently_used_blocks_once_for_the_run():
    alloc = BlockAllocator(3)
    lower = ListTier()
    cache = RadixCache(alloc, BS, None, lower=lower)
    a, b = list(range(1, 9)), list(range(100, 112))  # two blocks, three blocks
    blocks = alloc.allocate(2)
    cache.insert(a, blocks)
    alloc.decref(blocks)
    cache.evict(2)  # a goes down to the tier
    blocks = alloc.allocate(3)
    cache.insert(b, blocks)
    alloc.decref(blocks)  # the pool is full of b, all of it unlocked
    m = cache.match_and_load(a, 2)
    assert m.num_blocks == 2 and sorted(m.blocks) == sorted(b for _, b in lower.loaded)
    b_hashes = [block_hash(ROOT_HASH, b[:4])]
    b_hashes += [block_hash(b_hashes[0], b[4:8]), block_hash(block_hash(b_hashes[0], b[4:8]), b[8:12])]
    assert b_hashes[1] in lower and b_hashes[2] in lower  # b's last two blocks made the room (written back)
    assert cache.match_prefix(b).num_blocks == 1 and alloc.num_free == 0 and cache.num_cached_blocks == 3
