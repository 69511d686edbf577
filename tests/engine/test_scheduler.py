"""Scheduler on a tiny pool, driven by hand: which requests run each step and with how many tokens,
chunk boundaries, prefix reuse, lpm vs fcfs, retraction, abort, and progress. Exact block ids.

Every test builds its scheduler through the `sim` fixture, which checks the block accounting after
every step and, at teardown, aborts whatever is still live and checks that only the cache holds
blocks."""
from __future__ import annotations

import random

import pytest

from raypd.engine.cache.block_allocator import BlockAllocator
from raypd.engine.cache.radix_cache import RadixCache
from raypd.engine.request import Request, RequestStatus
from raypd.engine.scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from raypd.protocol.sampling_params import SamplingParams

FAKE_TOKEN = 900  # the k-th sampled token of every request is FAKE_TOKEN + k


def make_request(rid: str, tokens: list[int], max_tokens: int) -> Request:
    return Request(rid, list(tokens), SamplingParams(max_tokens=max_tokens, temperature=0),
                   stop_token_ids=frozenset(), max_total_tokens=len(tokens) + max_tokens)


def plan(batch: ScheduledBatch) -> list[tuple[str, int, int]]:
    """(request id, first position, number of tokens) per scheduled item, in batch order."""
    return [(x.request.request_id, x.start, x.num_tokens) for x in batch.items]


def ids(reqs) -> list[str]:
    return [r.request_id for r in reqs]


class Sim:
    """A scheduler over its own allocator and cache, plus the step loop an engine would run."""

    def __init__(self, num_blocks: int, **config):
        config.setdefault("block_size", 2)
        # No admission headroom unless a test asks: memory decisions then depend on blocks alone.
        config.setdefault("init_new_token_ratio", 0.0)
        config.setdefault("min_new_token_ratio", 0.0)
        self.config = SchedulerConfig(**config)
        self.allocator = BlockAllocator(num_blocks)
        self.cache = RadixCache(self.allocator, self.config.block_size, on_event=None)
        self.sched = Scheduler(self.config, self.allocator, self.cache)
        self.requests: list[Request] = []
        self.sampled: list[str] = []  # ids of the requests that sampled a token in the last step

    def add(self, rid: str, tokens: list[int], max_tokens: int) -> Request:
        req = make_request(rid, tokens, max_tokens)
        self.requests.append(req)
        self.sched.add(req)
        return req

    def step(self) -> ScheduledBatch:
        batch = self.sched.schedule()
        self.check({x.request: x.num_tokens for x in batch.items})
        self.apply(batch)
        return batch

    def apply(self, batch: ScheduledBatch) -> None:
        """What the engine does after running `batch`: update, append sampled tokens, finish."""
        # `samples` compares with the request's current length, so read it before appending.
        self.sampled = [x.request.request_id for x in batch.items if x.samples]
        self.sched.update(batch)
        for item in batch.items:
            if item.samples:
                req = item.request
                req.token_ids.append(FAKE_TOKEN + req.num_output_tokens)
                if req.num_output_tokens >= req.params.max_tokens:
                    self.sched.finish(req, RequestStatus.FINISHED_LENGTH)
        self.check({})

    def run(self, max_steps: int = 200) -> list[ScheduledBatch]:
        batches = []
        while self.sched.has_unfinished():
            assert len(batches) < max_steps, "no progress"
            batches.append(self.step())
        return batches

    @property
    def live(self) -> list[Request]:
        return [r for r in self.requests if not r.status.is_finished]

    def refcounts(self) -> list[int]:
        return [self.allocator.ref_count(b) for b in range(self.allocator.num_blocks)]

    def check(self, planned: dict[Request, int] | None = None) -> None:
        """Block accounting; `planned` maps the requests of a just-scheduled batch to their token
        counts ({} right after update)."""
        alloc, cache = self.allocator, self.cache
        cached = cache.cached_blocks()
        held = {b for r in self.live for b in r.block_table}
        assert alloc.num_free + len(cached) + len(held - cached) == alloc.num_blocks
        # Stronger: each block's count is one per cache entry plus one per block-table entry.
        expected = [0] * alloc.num_blocks
        for b in cached:
            expected[b] += 1
        for r in self.live:
            for b in r.block_table:
                expected[b] += 1
        assert self.refcounts() == expected
        assert alloc.num_free == expected.count(0)
        assert cache.num_cached_blocks == len(cached)
        # Lock counts: each node is locked once per live request whose prefix node is it or below it.
        locks: dict[int, int] = {}
        for r in self.live:
            node = r.prefix_node
            while node is not None and node is not cache.root:
                locks[id(node)] = locks.get(id(node), 0) + 1
                node = node.parent
        tree, stack = [], list(cache.root.children.values())
        while stack:
            x = stack.pop()
            tree.append(x)
            stack.extend(x.children.values())
        assert len(tree) == len(cached)
        assert {id(x): x.lock_ref for x in tree if x.lock_ref} == locks
        assert cache.num_evictable_blocks == sum(1 for x in tree if x.lock_ref == 0)
        # Waiting and finished requests hold nothing; queues hold exactly the live requests.
        for r in list(self.sched.waiting) + [r for r in self.requests if r.status.is_finished]:
            assert r.block_table == [] and r.prefix_node is None and r.num_computed_tokens == 0
        assert all(r.status == RequestStatus.WAITING for r in self.sched.waiting)
        assert all(r.status == RequestStatus.RUNNING for r in self.sched.running)
        assert sorted(ids(self.sched.waiting) + ids(self.sched.running)) == sorted(ids(self.live))
        # A running request's table covers its computed tokens plus what this step schedules.
        for r in self.sched.running:
            need = -(-(r.num_computed_tokens + (planned or {}).get(r, 0)) // self.config.block_size)
            if planned is None:  # outside step(): a batch may be scheduled but not yet applied
                assert len(r.block_table) >= need
            else:
                assert len(r.block_table) == need

    def check_drained(self) -> None:
        """All requests finished or aborted: only the prefix cache holds blocks."""
        assert not self.sched.has_unfinished()
        assert all(r.block_table == [] and r.prefix_node is None for r in self.requests)
        assert sum(self.refcounts()) == self.cache.num_cached_blocks
        assert self.allocator.num_free + self.cache.num_cached_blocks == self.allocator.num_blocks
        assert self.cache.num_evictable_blocks == self.cache.num_cached_blocks


@pytest.fixture
def sim():
    made: list[Sim] = []

    def make(num_blocks: int, **config) -> Sim:
        s = Sim(num_blocks, **config)
        made.append(s)
        return s

    yield make
    for s in made:
        s.check()
        for r in s.live:
            s.sched.abort(r)
            s.check()
        s.check_drained()


# -- token budget and running cap -----------------------------------------------------------------
def test_token_budget_splits_the_last_admitted_prompt(sim):
    s = sim(32, max_num_batched_tokens=8, chunked_prefill_size=8)
    a, b, c = s.add("a", [1, 2, 3], 2), s.add("b", [4, 5, 6], 2), s.add("c", [7, 8, 9], 2)
    batch = s.step()
    assert plan(batch) == [("a", 0, 3), ("b", 0, 3), ("c", 0, 2)]
    assert s.sampled == ["a", "b"]
    assert ids(s.sched.running) == ["a", "b", "c"]
    assert (a.block_table, b.block_table, c.block_table) == ([0, 1], [2, 3], [4])


def test_running_requests_then_admissions_share_one_budget(sim):
    s = sim(32, max_num_batched_tokens=8, chunked_prefill_size=8)
    for rid, toks in (("a", [1, 2, 3]), ("b", [4, 5, 6]), ("c", [7, 8, 9])):
        s.add(rid, toks, 2)
    assert plan(s.step()) == [("a", 0, 3), ("b", 0, 3), ("c", 0, 2)]
    s.add("d", [10, 11, 12, 13, 14, 15, 16], 1)
    # Decodes of a and b, c's last prompt token (also one token), then d gets the 5 left.
    assert plan(s.step()) == [("a", 3, 1), ("b", 3, 1), ("c", 2, 1), ("d", 0, 5)]
    assert [r.status for r in s.requests[:3]] == [RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_LENGTH,
                                                  RequestStatus.RUNNING]
    assert plan(s.step()) == [("c", 3, 1), ("d", 5, 2)]
    s.run()
    s.check_drained()


def test_max_running_requests_caps_admission(sim):
    s = sim(32, max_running_requests=2)
    s.add("a", [1, 2, 3], 1)
    s.add("b", [4, 5, 6], 2)
    s.add("c", [7, 8, 9], 1)
    assert plan(s.step()) == [("a", 0, 3), ("b", 0, 3)]
    assert ids(s.sched.waiting) == ["c"]
    assert s.requests[0].status == RequestStatus.FINISHED_LENGTH  # a is done after one token
    assert plan(s.step()) == [("b", 3, 1), ("c", 0, 3)]
    s.run()
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in s.requests)


def test_empty_scheduler_returns_an_empty_batch(sim):
    s = sim(4)
    batch = s.sched.schedule()
    assert not batch and batch.items == [] and batch.retracted == [] and batch.num_tokens == 0


# -- chunked prefill ------------------------------------------------------------------------------
def test_long_prompt_is_split_at_chunk_boundaries(sim):
    s = sim(16, chunked_prefill_size=4, max_num_batched_tokens=64)
    r = s.add("a", list(range(1, 11)), 2)
    steps = []
    for _ in range(3):
        batch = s.step()
        steps.append((plan(batch), s.sampled, list(r.block_table), s.cache.num_cached_blocks))
    assert steps == [
        ([("a", 0, 4)], [], [0, 1], 2),  # each chunk's full blocks are published at once
        ([("a", 4, 4)], [], [0, 1, 2, 3], 4),
        ([("a", 8, 2)], ["a"], [0, 1, 2, 3, 4], 5),
    ]
    assert r.output_token_ids == [FAKE_TOKEN]
    assert plan(s.step()) == [("a", 10, 1)]
    assert r.status == RequestStatus.FINISHED_LENGTH


def test_budget_smaller_than_chunk_sets_the_chunk(sim):
    s = sim(16, chunked_prefill_size=4, max_num_batched_tokens=3)
    s.add("a", list(range(1, 9)), 1)
    assert [plan(s.step()) for _ in range(3)] == [[("a", 0, 3)], [("a", 3, 3)], [("a", 6, 2)]]
    assert not s.sched.has_unfinished()


def test_decodes_are_scheduled_before_chunked_prefills(sim):
    s = sim(16, chunked_prefill_size=4, max_num_batched_tokens=5)
    s.add("long", list(range(1, 11)), 1)
    s.add("short", [50], 3)
    assert plan(s.step()) == [("long", 0, 4), ("short", 0, 1)]
    assert ids(s.sched.running) == ["long", "short"]
    # "short" was admitted after "long" but decodes first.
    assert plan(s.step()) == [("short", 1, 1), ("long", 4, 4)]
    assert plan(s.step()) == [("short", 2, 1), ("long", 8, 2)]
    s.run()


def test_chunking_off_sends_a_prompt_in_one_piece_when_alone(sim):
    s = sim(16, chunked_prefill_size=0, max_num_batched_tokens=4)
    s.add("a", list(range(1, 8)), 2)
    s.add("b", [20, 21], 1)
    assert plan(s.step()) == [("a", 0, 7)]  # over the budget, but alone in the step
    assert ids(s.sched.waiting) == ["b"]
    assert plan(s.step()) == [("a", 7, 1), ("b", 0, 2)]


def test_chunking_off_keeps_a_prompt_that_exceeds_the_budget_waiting_when_not_alone(sim):
    s = sim(16, chunked_prefill_size=0, max_num_batched_tokens=4)
    s.add("a", [1, 2, 3], 2)
    s.add("b", [5, 6, 7, 8, 9, 10], 2)
    batch = s.step()
    assert plan(batch) == [("a", 0, 3)]  # actual: [("a", 0, 3), ("b", 0, 6)], 9 tokens > budget 4
    assert ids(s.sched.waiting) == ["b"]


# -- prefix cache ---------------------------------------------------------------------------------
def test_fully_cached_block_aligned_prompt_recomputes_its_last_block(sim):
    s = sim(8)
    a = s.add("a", [1, 2, 3, 4], 1)
    s.run()
    assert s.cache.cached_blocks() == {0, 1}
    b = s.add("b", [1, 2, 3, 4], 1)
    batch = s.sched.schedule()
    assert plan(batch) == [("b", 2, 2)]
    assert b.num_computed_tokens == 2 and b.num_cached_tokens == 2
    assert b.block_table == [0, 2]  # the cached head, then a fresh block for tokens 3..4
    s.sched.update(batch)
    # Publishing the recomputed block finds the cached copy: b switches to it, 2 goes back.
    assert b.block_table == [0, 1]
    assert s.allocator.ref_count(2) == 0
    assert a.status == RequestStatus.FINISHED_LENGTH
    s.check()


def test_fully_cached_unaligned_prompt_leaves_one_token(sim):
    s = sim(8)
    s.add("a", [1, 2, 3, 4, 5], 1)
    s.run()
    b = s.add("b", [1, 2, 3, 4, 5], 1)
    batch = s.step()
    assert plan(batch) == [("b", 4, 1)]
    assert s.sampled == ["b"]
    assert b.num_cached_tokens == 4
    assert b.status == RequestStatus.FINISHED_LENGTH


def test_one_token_prompt_is_never_served_from_cache(sim):
    s = sim(8, block_size=1)
    s.add("a", [7], 1)
    s.run()
    b = s.add("b", [7], 1)
    assert plan(s.step()) == [("b", 0, 1)]
    assert b.num_cached_tokens == 0


def test_second_request_reuses_the_first_requests_blocks(sim):
    s = sim(8)
    a = s.add("a", [1, 2, 3, 4, 5], 2)
    s.run()
    # a computed [1,2,3,4,5,900] into blocks 0,1,2; all three stay cached.
    assert s.cache.cached_blocks() == {0, 1, 2}
    assert a.output_token_ids == [FAKE_TOKEN, FAKE_TOKEN + 1]
    b = s.add("b", [1, 2, 3, 4, 7, 8, 9], 1)
    batch = s.sched.schedule()
    assert plan(batch) == [("b", 4, 3)]
    assert b.block_table == [0, 1, 3, 4]
    assert b.num_cached_tokens == 4
    assert [s.allocator.ref_count(x) for x in (0, 1)] == [2, 2]  # cache + b
    s.sched.update(batch)
    s.check()


def test_prompt_blocks_are_shared_while_the_first_request_still_runs(sim):
    s = sim(16)
    a = s.add("a", [1, 2, 3, 4, 5], 3)
    assert plan(s.step()) == [("a", 0, 5)]
    b = s.add("b", [1, 2, 3, 4, 6, 6], 2)
    assert plan(s.step()) == [("a", 5, 1), ("b", 4, 2)]
    assert b.block_table[:2] == a.block_table[:2] == [0, 1]
    assert b.num_cached_tokens == 4
    node = s.cache.match_prefix([1, 2, 3, 4]).node
    assert node.lock_ref == 2 and node.parent.lock_ref == 2  # a and b both lock the shared path
    s.run()


def test_identical_prompts_in_one_step_end_up_on_the_same_blocks(sim):
    s = sim(8)
    a = s.add("a", [1, 2, 3, 4, 5], 2)
    b = s.add("b", [1, 2, 3, 4, 5], 2)
    batch = s.sched.schedule()
    assert plan(batch) == [("a", 0, 5), ("b", 0, 5)]
    assert (a.block_table, b.block_table) == ([0, 1, 2], [3, 4, 5])
    s.sched.update(batch)
    # a published first; b drops its duplicates 3 and 4 and points at a's blocks.
    assert (a.block_table, b.block_table) == ([0, 1, 2], [0, 1, 5])
    assert s.refcounts() == [3, 3, 1, 0, 0, 1, 0, 0]
    assert s.allocator.num_free == 4
    assert b.num_cached_tokens == 0  # computed, not served from cache
    s.check()


def test_prefix_cache_disabled_keeps_nothing(sim):
    s = sim(8, enable_prefix_cache=False)
    s.add("a", [1, 2, 3, 4, 5], 2)
    s.run()
    assert s.cache.num_cached_blocks == 0 and s.allocator.num_free == 8
    b = s.add("b", [1, 2, 3, 4, 5], 1)
    assert plan(s.step()) == [("b", 0, 5)]
    assert b.num_cached_tokens == 0
    s.check_drained()


# -- policy ---------------------------------------------------------------------------------------
def _warm(s: Sim) -> None:
    s.add("warm", [1, 2, 3, 4, 5], 1)
    s.run()


@pytest.mark.parametrize("policy, first", [("fcfs", "cold"), ("lpm", "hot")])
def test_lpm_admits_the_longest_cached_prefix_first(sim, policy, first):
    s = sim(16, schedule_policy=policy, max_running_requests=1)
    _warm(s)
    s.add("cold", [8, 8, 8, 8, 8], 1)
    s.add("half", [1, 2, 9, 9, 9], 1)
    s.add("hot", [1, 2, 3, 4, 7], 1)
    batch = s.step()
    assert ids(x.request for x in batch.items) == [first]
    order = [ids(x.request for x in s.step().items)[0] for _ in range(2)]
    expected = {"fcfs": ["half", "hot"], "lpm": ["half", "cold"]}[policy]
    assert order == expected


def test_lpm_keeps_arrival_order_among_equal_matches(sim):
    s = sim(16, schedule_policy="lpm", max_running_requests=1)
    _warm(s)
    for rid in ("z", "x", "y"):
        s.add(rid, [1, 2, 3, 4, ord(rid)], 1)
    assert [ids(x.request for x in s.step().items) for _ in range(3)] == [["z"], ["x"], ["y"]]


def test_lpm_falls_back_to_fcfs_past_lpm_max_waiting(sim):
    s = sim(16, schedule_policy="lpm", max_running_requests=1, lpm_max_waiting=1)
    _warm(s)
    s.add("cold", [8, 8, 8, 8, 8], 1)
    s.add("hot", [1, 2, 3, 4, 7], 1)
    assert ids(x.request for x in s.step().items) == ["cold"]


def test_lpm_without_prefix_cache_is_fcfs(sim):
    s = sim(16, schedule_policy="lpm", max_running_requests=1, enable_prefix_cache=False)
    _warm(s)
    s.add("cold", [8, 8, 8, 8, 8], 1)
    s.add("hot", [1, 2, 3, 4, 7], 1)
    assert ids(x.request for x in s.step().items) == ["cold"]


@pytest.mark.parametrize("policy, expected", [
    ("fcfs", [("long", 8, 8)]),                      # the running prefill takes the whole budget
    ("srpt", [("short", 0, 3), ("long", 8, 5)])])    # the short prompt starts first, long gets the rest
def test_srpt_starts_a_short_prompt_ahead_of_a_long_prefill(sim, policy, expected):
    s = sim(32, schedule_policy=policy, max_num_batched_tokens=8, chunked_prefill_size=8)
    long = s.add("long", list(range(1, 21)), 1)
    assert plan(s.step()) == [("long", 0, 8)]
    short = s.add("short", [30, 31, 32], 1)
    short.queued_at = long.queued_at  # no aging credit either way
    assert plan(s.step()) == expected
    s.run()
    s.check_drained()


def test_srpt_counts_a_cached_prefix_as_done(sim):
    s = sim(16, schedule_policy="srpt", max_running_requests=1)
    _warm(s)
    cold = s.add("cold", [8, 8, 8], 1)            # 3 tokens to compute
    hot = s.add("hot", [1, 2, 3, 4, 7], 1)        # 5 tokens, 4 of them cached: 1 to compute
    hot.queued_at = cold.queued_at
    assert [ids(x.request for x in s.step().items) for _ in range(2)] == [["hot"], ["cold"]]


@pytest.mark.parametrize("waited_s, first", [(0.0, "short"), (100.0, "long")])
def test_srpt_aging_lets_a_long_prompt_pass_newer_short_ones(sim, waited_s, first):
    s = sim(32, schedule_policy="srpt", max_running_requests=1, srpt_aging_tokens_per_s=1.0)
    long = s.add("long", list(range(1, 10)), 1)
    short = s.add("short", [30, 31, 32], 1)
    long.queued_at = short.queued_at - waited_s    # 9 - 100 x 1 token/s ranks ahead of 3
    assert ids(x.request for x in s.step().items) == [first]
    s.run()
    s.check_drained()


@pytest.mark.parametrize("policy", ["fcfs", "srpt"])
def test_prefill_cap_bounds_prompt_tokens_per_step_after_the_decodes(sim, policy):
    """A decode node prefilling a prompt itself: its decodes keep the step, prompts get at most the cap."""
    s = sim(64, schedule_policy=policy, max_num_batched_tokens=64, chunked_prefill_size=64,
            max_prefill_tokens_per_step=3)
    s.add("d1", [1], 6)
    s.add("d2", [2], 6)
    assert plan(s.step()) == [("d1", 0, 1), ("d2", 0, 1)]   # two 1-token prompts: 2 <= 3
    s.add("p", list(range(10, 18)), 1)
    s.add("q", [40, 41], 1)
    steps = [plan(s.step()) for _ in range(3)]
    assert steps[0] == [("d1", 1, 1), ("d2", 1, 1), ("p", 0, 3)] if policy == "fcfs" else \
        steps[0] == [("d1", 1, 1), ("d2", 1, 1), ("q", 0, 2), ("p", 0, 1)]
    for step in steps:
        prompt_tokens = sum(n for rid, _, n in step if rid in ("p", "q"))
        assert prompt_tokens <= 3
        assert [rid for rid, _, _ in step[:2]] == ["d1", "d2"]    # every decode runs in every step
    s.run()
    s.check_drained()


def test_prefill_cap_needs_chunked_prefill():
    from raypd.engine.config import EngineConfig
    from raypd.engine.errors import ConfigError

    with pytest.raises(ConfigError, match="needs chunked prefill"):
        EngineConfig(max_prefill_tokens_per_step=32, chunked_prefill_size=0)
    assert EngineConfig(max_prefill_tokens_per_step=32).max_prefill_tokens_per_step == 32


def test_prefill_cap_applies_only_to_steps_that_decode(sim):
    """While a request decodes, the prompt gets the cap; once nothing decodes, the whole budget."""
    s = sim(64, max_num_batched_tokens=8, chunked_prefill_size=8, max_prefill_tokens_per_step=2)
    s.add("d", [50], 3)
    assert plan(s.step()) == [("d", 0, 1)]
    s.add("p", list(range(1, 21)), 1)
    assert plan(s.step()) == [("d", 1, 1), ("p", 0, 2)]
    assert plan(s.step()) == [("d", 2, 1), ("p", 2, 2)]        # d's third token ends it
    assert plan(s.step()) == [("p", 4, 8)]
    s.run()
    s.check_drained()


# -- admission headroom ---------------------------------------------------------------------------
def test_admission_reserves_room_for_running_requests_future_tokens(sim):
    # ratio 1.0, no decay: every running request's remaining max_tokens must fit.
    s = sim(6, init_new_token_ratio=1.0, min_new_token_ratio=1.0, new_token_ratio_decay=0.0)
    s.add("a", [1, 2], 6)  # 8 tokens: 4 blocks over its life
    assert plan(s.step()) == [("a", 0, 2)]
    s.add("b", [3, 4], 2)
    # After a's decode takes block 1, 4 blocks are free. Reserve for a (5 tokens to go) and b (2):
    # ceil(7 / 2) = 4 blocks, but only 4 - 1 (b's prompt block) = 3 would be left.
    assert plan(s.step()) == [("a", 2, 1)]
    assert ids(s.sched.waiting) == ["b"]
    s.run()
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in s.requests)
    assert s.sched.num_retractions == 0


def test_without_headroom_the_same_request_is_admitted(sim):
    s = sim(6)
    s.add("a", [1, 2], 6)
    s.step()
    s.add("b", [3, 4], 2)
    assert plan(s.step()) == [("a", 2, 1), ("b", 0, 2)]


def test_new_token_ratio_decays_per_step_and_resets_on_retraction(sim):
    s = sim(5, init_new_token_ratio=0.3, min_new_token_ratio=0.0, new_token_ratio_decay=0.1)
    s.add("a", [1, 2, 3], 4)
    b = s.add("b", [11, 12, 13, 14], 3)
    ratios, retracted = [], []
    for _ in range(5):
        retracted.append(ids(s.step().retracted))
        ratios.append(s.sched.new_token_ratio)
    assert retracted == [[], [], ["b"], [], []]
    # Back to 0.3 on the retraction, then that step's own decay; never below the minimum.
    assert ratios == pytest.approx([0.2, 0.1, 0.2, 0.1, 0.0])
    assert b.status == RequestStatus.FINISHED_LENGTH


# -- retraction -----------------------------------------------------------------------------------
def test_retraction_takes_the_most_recently_admitted_request(sim):
    s = sim(5)
    a = s.add("a", [1, 2, 3], 4)
    b = s.add("b", [11, 12, 13, 14], 3)
    assert plan(s.step()) == [("a", 0, 3), ("b", 0, 4)]
    assert (a.block_table, b.block_table) == ([0, 1], [2, 3])
    assert plan(s.step()) == [("a", 3, 1), ("b", 4, 1)]
    assert b.block_table == [2, 3, 4] and s.allocator.num_free == 0
    assert b.output_token_ids == [FAKE_TOKEN, FAKE_TOKEN + 1]

    # a needs a block for position 4; nothing is free or evictable, so b (admitted last) goes.
    batch = s.step()
    assert plan(batch) == [("a", 4, 1)]
    assert batch.retracted == [b]
    assert b.status == RequestStatus.WAITING
    assert list(s.sched.waiting) == [b]
    assert b.num_computed_tokens == 0 and b.block_table == [] and b.prefix_node is None
    assert b.num_retractions == 1 and s.sched.num_retractions == 1
    assert a.block_table == [0, 1, 4]  # b's partial block went to a
    # b's full computed blocks stay cached and unlocked, ready for its return.
    assert s.cache.match_prefix(b.token_ids).blocks == [2, 3]
    assert s.cache.cached_blocks() == {0, 2, 3}
    assert s.cache.num_evictable_blocks == 2
    assert b.output_token_ids == [FAKE_TOKEN, FAKE_TOKEN + 1]  # outputs are kept

    assert plan(s.step()) == [("a", 5, 1)]  # a finishes; b could not fit beside it
    assert a.status == RequestStatus.FINISHED_LENGTH
    # b comes back from its cached prefix, recomputes its outputs and continues where it stopped.
    batch = s.step()
    assert plan(batch) == [("b", 4, 2)]
    assert s.sampled == ["b"]
    assert b.status == RequestStatus.FINISHED_LENGTH
    assert b.output_token_ids == [FAKE_TOKEN, FAKE_TOKEN + 1, FAKE_TOKEN + 2]
    assert b.num_cached_tokens == 0  # set at first admission only
    assert b.num_retractions == 1
    s.check_drained()


def test_retraction_caches_full_blocks_that_hold_outputs(sim):
    s = sim(5)
    a = s.add("a", [1, 2], 5)
    b = s.add("b", [11, 12, 13], 4)
    assert [plan(s.step()) for _ in range(3)] == [
        [("a", 0, 2), ("b", 0, 3)], [("a", 2, 1), ("b", 3, 1)], [("a", 3, 1), ("b", 4, 1)]]
    assert (a.block_table, b.block_table) == ([0, 3], [1, 2, 4])
    # b's block 2 holds [13, 900]: a prompt token and an output, so update() never published it.
    assert s.cache.cached_blocks() == {0, 1}
    batch = s.step()
    assert batch.retracted == [b]
    assert plan(batch) == [("a", 4, 1)]
    assert a.block_table == [0, 3, 4]  # b's partial block [901]
    assert s.cache.match_prefix(b.token_ids).blocks == [1, 2]  # published on retraction
    s.step()
    assert a.status == RequestStatus.FINISHED_LENGTH
    assert plan(s.step()) == [("b", 4, 2)]  # from its two cached blocks: recompute 901, 902
    s.run()
    assert b.output_token_ids == [FAKE_TOKEN + k for k in range(4)]


def test_retraction_skips_older_requests_and_requeues_at_the_front(sim):
    s = sim(6, max_running_requests=3)
    a = s.add("a", [1, 2, 3, 4], 3)
    b = s.add("b", [11, 12, 13], 3)
    c = s.add("c", [21, 22, 23], 2)
    d = s.add("d", [31], 1)  # waits behind the running cap
    assert plan(s.step()) == [("a", 0, 4), ("b", 0, 3), ("c", 0, 3)]
    assert (a.block_table, b.block_table, c.block_table) == ([0, 1], [2, 3], [4, 5])
    assert ids(s.sched.waiting) == ["d"]
    # Only a needs a new block (position 4); c, the newest, is retracted, not b.
    batch = s.step()
    assert batch.retracted == [c]
    assert plan(batch) == [("a", 4, 1), ("b", 3, 1)]
    assert ids(s.sched.waiting) == ["c", "d"]
    assert ids(s.sched.running) == ["a", "b"]
    assert a.block_table == [0, 1, 5]
    assert s.cache.match_prefix([21, 22, 23]).blocks == [4]
    assert s.sched.num_retractions == 1
    s.run()
    assert [r.status for r in (a, b, c, d)] == [RequestStatus.FINISHED_LENGTH] * 4
    assert c.output_token_ids == [FAKE_TOKEN, FAKE_TOKEN + 1]


def test_newest_request_retracts_itself_when_it_is_the_one_short(sim):
    s = sim(3)
    a = s.add("a", [1, 2, 3], 2)
    b = s.add("b", [11, 12], 2)
    assert plan(s.step()) == [("a", 0, 3), ("b", 0, 2)]
    assert s.allocator.num_free == 0
    # b's decode needs a third block; a needs none. b is the newest, so b steps back.
    batch = s.step()
    assert batch.retracted == [b]
    assert plan(batch) == [("a", 3, 1)]
    assert a.status == RequestStatus.FINISHED_LENGTH
    s.run()
    assert b.output_token_ids == [FAKE_TOKEN, FAKE_TOKEN + 1]


def test_retracting_a_request_scheduled_earlier_in_the_step_returns_its_new_block(sim):
    s = sim(3, chunked_prefill_size=2, max_num_batched_tokens=4)
    p = s.add("p", [1, 2, 3, 4], 1)
    d = s.add("d", [11, 12], 2)
    assert plan(s.step()) == [("p", 0, 2), ("d", 0, 2)]
    assert (p.block_table, d.block_table) == ([0], [1])
    # d decodes first and takes block 2; then p's chunk needs a block, d (newest) is retracted
    # and the block it took this step goes to p.
    batch = s.step()
    assert batch.retracted == [d]
    assert plan(batch) == [("p", 2, 2)]
    assert p.status == RequestStatus.FINISHED_LENGTH
    assert s.cache.match_prefix([1, 2, 3, 4]).blocks == [0, 2]
    assert s.cache.match_prefix([11, 12, 900]).blocks == [1]
    assert s.allocator.num_free == 0
    # d resumes from its cached block and recomputes only its sampled token.
    assert plan(s.step()) == [("d", 2, 1)]
    s.run()
    assert d.output_token_ids == [FAKE_TOKEN, FAKE_TOKEN + 1]


def test_block_taken_by_a_retracted_request_this_step_is_returned_first(sim):
    s = sim(3, chunked_prefill_size=2, max_num_batched_tokens=4, enable_prefix_cache=False)
    p = s.add("p", [1, 2, 3, 4], 1)
    d = s.add("d", [11, 12], 2)
    s.step()
    assert (p.block_table, d.block_table) == ([0], [1])
    batch = s.sched.schedule()
    assert batch.retracted == [d]
    # d's new block 2 is undone before d's own block 1 is released, so p gets 2.
    assert p.block_table == [0, 2]
    s.apply(batch)
    s.run()
    assert d.output_token_ids == [FAKE_TOKEN, FAKE_TOKEN + 1]


def test_no_admission_in_a_step_that_retracted(sim):
    s = sim(5)
    s.add("a", [1, 2, 3], 4)
    s.add("b", [11, 12, 13, 14], 3)
    s.step()
    s.step()
    s.add("tiny", [7], 1)
    batch = s.step()
    assert ids(batch.retracted) == ["b"]
    assert ids(x.request for x in batch.items) == ["a"]
    assert ids(s.sched.waiting) == ["b", "tiny"]
    assert s.cache.num_evictable_blocks == 2  # tiny would have fit by evicting b's blocks


# -- abort ----------------------------------------------------------------------------------------
def test_abort_waiting_request(sim):
    s = sim(4)
    a = s.add("a", [1, 2, 3], 1)
    s.sched.abort(a)
    assert a.status == RequestStatus.FINISHED_ABORTED
    assert a.status.finish_reason == "abort"
    assert not s.sched.has_unfinished()
    assert s.allocator.num_free == 4
    s.sched.abort(a)  # aborting a finished request is a no-op
    assert a.status == RequestStatus.FINISHED_ABORTED
    assert not s.sched.schedule()
    s.check_drained()


def test_refused_admission_releases_the_matched_prefix(sim):
    s = sim(6)
    s.add("w", [1, 2, 3, 4], 1)
    s.run()
    assert s.cache.cached_blocks() == {0, 1}
    s.add("hog", [9] * 7, 1)  # takes the four free blocks
    big = s.add("big", [1, 2, 3, 4, 5, 6, 7], 1)  # matches blocks 0, 1 but needs two more
    assert plan(s.step()) == [("hog", 0, 7)]
    assert ids(s.sched.waiting) == ["big"]
    # The match was undone: no lock, no reference, nothing in big's table (Sim.check pins the rest).
    assert big.prefix_node is None and big.block_table == [] and big.num_computed_tokens == 0
    assert [s.allocator.ref_count(b) for b in (0, 1)] == [1, 1]
    assert s.cache.match_prefix([1, 2, 3, 4]).node.lock_ref == 0
    assert big.num_cached_tokens is None  # not admitted yet
    s.sched.abort(big)
    assert big.status == RequestStatus.FINISHED_ABORTED
    s.run()
    s.check_drained()


def test_abort_running_request_mid_prefill_keeps_only_computed_blocks_cached(sim):
    s = sim(8, chunked_prefill_size=4)
    a = s.add("a", list(range(1, 11)), 3)
    b = s.add("b", [1, 2, 3, 4, 99], 1)  # shares a's first two blocks once a publishes them
    assert plan(s.step()) == [("a", 0, 4), ("b", 0, 4)]
    assert plan(s.step()) == [("b", 4, 1), ("a", 4, 4)]  # b's last prompt token ranks as a decode
    assert b.status == RequestStatus.FINISHED_LENGTH
    s.sched.abort(a)
    assert a.status == RequestStatus.FINISHED_ABORTED
    assert a.block_table == [] and a.prefix_node is None and a.num_computed_tokens == 0
    assert a not in s.sched.running
    # Its computed full blocks stay cached, unlocked.
    assert s.cache.match_prefix(list(range(1, 11))).num_blocks == 4
    assert s.cache.num_evictable_blocks == s.cache.num_cached_blocks
    s.check_drained()


def test_abort_running_request_between_schedule_and_update(sim):
    s = sim(8)
    a = s.add("a", [1, 2, 3, 4], 2)
    s.step()
    batch = s.sched.schedule()
    assert plan(batch) == [("a", 4, 1)]
    assert a.block_table == [0, 1, 2]  # block 2 was taken for this step's token
    s.sched.abort(a)
    assert s.cache.cached_blocks() == {0, 1}  # only blocks whose KV was computed and full
    assert s.allocator.ref_count(2) == 0 and s.allocator.num_free == 6
    s.check_drained()


def test_abort_retracted_request(sim):
    s = sim(5)
    s.add("a", [1, 2, 3], 4)
    b = s.add("b", [11, 12, 13, 14], 3)
    s.step()
    s.step()
    assert s.step().retracted == [b]
    s.sched.abort(b)
    assert b.status == RequestStatus.FINISHED_ABORTED
    assert ids(s.sched.waiting) == []
    s.run()
    s.check_drained()


def test_abort_with_prefix_cache_disabled_frees_all_blocks(sim):
    s = sim(8, enable_prefix_cache=False, chunked_prefill_size=2)
    a = s.add("a", [1, 2, 3, 4, 5], 2)
    s.step()
    s.step()
    assert a.block_table == [0, 1]
    s.sched.abort(a)
    assert s.allocator.num_free == 8
    s.check_drained()


# -- progress -------------------------------------------------------------------------------------
@pytest.mark.parametrize("block_size", [1, 2, 3, 4])
@pytest.mark.parametrize("chunk", [0, 1, 3, 64])
@pytest.mark.parametrize("prefix_cache", [True, False])
@pytest.mark.parametrize("shared", [0, 1, 5])
def test_lone_request_that_fits_always_finishes(sim, block_size, chunk, prefix_cache, shared):
    """A request that needs every block of the pool finishes, whatever the cache holds first."""
    num_blocks = 4
    s = sim(num_blocks, block_size=block_size, chunked_prefill_size=chunk, max_num_batched_tokens=5,
            enable_prefix_cache=prefix_cache)
    # Fill the cache with other prefixes, the last one sharing `shared` tokens with the request.
    capacity = num_blocks * block_size
    s.add("junk1", [77] * (capacity - 1), 1)
    s.run()
    prompt = list(range(1, capacity - 1))
    s.add("junk2", prompt[:shared] + [66] * (capacity - 1 - shared), 1)
    s.run()
    r = s.add("r", prompt, capacity - len(prompt))  # exactly fills the pool
    batches = s.run(max_steps=4 * capacity)
    assert r.status == RequestStatus.FINISHED_LENGTH
    assert r.num_output_tokens == r.params.max_tokens
    assert s.sched.num_retractions == 0
    assert all(b.retracted == [] for b in batches)


@pytest.mark.parametrize("seed", range(40))
def test_random_workloads_finish_with_exact_accounting(sim, seed):
    """Many small requests on a tight pool (each fits alone): everything finishes, every sampled
    token lands once, and the accounting holds after every step (checked inside Sim.step)."""
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 3, 4])
    num_blocks = rng.randint(2, 8)
    s = sim(num_blocks, block_size=bs, max_num_batched_tokens=rng.randint(1, 12),
            chunked_prefill_size=rng.choice([0, 2, 3, 100]), max_running_requests=rng.randint(1, 4),
            schedule_policy=rng.choice(["fcfs", "lpm", "srpt"]), enable_prefix_cache=rng.random() < 0.8,
            init_new_token_ratio=rng.choice([0.0, 0.5, 1.0]), new_token_ratio_decay=rng.choice([0.0, 0.1]),
            max_prefill_tokens_per_step=rng.choice([None, None, 1, 2, 5]))
    pending = []
    for i in range(rng.randint(1, 7)):
        while True:
            prompt_len, max_tokens = rng.randint(1, num_blocks * bs), rng.randint(1, 5)
            if -(-(prompt_len + max_tokens) // bs) <= num_blocks:
                break
        pending.append((f"r{i}", [rng.randint(1, 2) for _ in range(prompt_len)], max_tokens))
    aborted = set()
    for _ in range(2000):
        if not pending and not s.sched.has_unfinished():
            break
        if pending and rng.random() < 0.5:
            s.add(*pending.pop(0))
        if s.live and rng.random() < 0.03:
            victim = rng.choice(s.live)
            s.sched.abort(victim)
            aborted.add(victim.request_id)
            s.check()
        batch = s.step()
        assert all(r.status == RequestStatus.WAITING for r in batch.retracted)
    else:
        pytest.fail("no progress")
    for r in s.requests:
        if r.request_id in aborted:
            assert r.status == RequestStatus.FINISHED_ABORTED
        else:
            assert r.status == RequestStatus.FINISHED_LENGTH
            assert r.output_token_ids == [FAKE_TOKEN + k for k in range(r.params.max_tokens)]
    s.check_drained()
