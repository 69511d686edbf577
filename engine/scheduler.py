"""The node-local scheduler: which requests run in the next step, and with how many tokens.

Works on ints only (token ids, block ids, counts); the model runner builds the tensors.

One step, in order:
1. Running requests: decodes (one token each) first, then prompts being prefilled in chunks. Each
   gets the blocks its new tokens need; when the pool is dry even after evicting unlocked prefix
   cache leaves, the most recently admitted running request is retracted (LIFO) and goes back to
   the front of the waiting queue, to be recomputed later from its cached prefix.
2. Waiting requests, in policy order (fcfs, or longest cached prefix first), while the step's token
   budget, the running-request cap and memory allow. Admission keeps room for the future tokens of
   everything running: `new_token_ratio` x their remaining max_tokens, a ratio that decays each
   step and jumps back up after a retraction (SGLang's estimate).
   With `srpt` (shortest remaining prompt first), steps 1 and 2 merge after the decodes: prompts
   being prefilled and waiting ones take the budget in order of their uncomputed prompt tokens
   (less a cached prefix), each less `srpt_aging_tokens_per_s` x the seconds since it reached the
   node. A 64-token prompt then starts at the next step instead of after every 1024-token prompt
   ahead of it, and aging bounds how long a long prompt can be passed over.
Priority (SamplingParams.priority, lower is more urgent) comes before every policy: the waiting
queue is ordered by priority, then by the policy's order. When the head of the queue cannot start
for want of a running slot or of memory, the least urgent running request that is less urgent than
it (the newest among equals) is preempted: back to the waiting queue, first of its priority, with
its computed blocks left in the prefix cache, so it resumes from there (vLLM's priority policy).
Tenants (SamplingParams.tenant) share the node within a priority: the waiting requests of the
tenant this node has computed the fewest tokens for come first (Virtual Token Counters,
protocol/fair_share.py; a tenant that comes back is lifted to the smallest counter of those with
requests here), a tie going to the tenant with fewer requests waiting (as at the ingress's line:
a tenant just lifted to a flood's level would otherwise wait behind all of the flood's queue),
then the policy's order. Fairness orders the queue only: it preempts
nothing, and with one tenant the order is the policy's alone.
A node bounds its waiting queue (max_waiting_requests); at the bound, displaced_by() says whether a
newcomer takes the place of the request that would start last (SGLang's accept-or-preempt by
priority, the ingress's line in cluster/serve/admission.py): by the same key, a waiting request
that never started, and only when the newcomer ranks strictly before it.
Prompts longer than `chunked_prefill_size` are split across steps (chunked prefill), and a step
mixes decode tokens with prefill chunks (continuous batching). `max_prefill_tokens_per_step` caps
the prompt tokens of a step that also decodes (a decode node that prefills prompts itself keeps
its TPOT; idle, it prefills at full speed).
Yielding steps (engine/step_yield.py, `yield_step_tokens`): while more than one class (priority,
tenant) has come lately, the prompts of the classes ranking after the first (priority, then the
class's service rate lately) get at most that many tokens a step, and none while a prompt of the
first class can run, so that one waits for a small step at most, whatever it waits behind; the
waiting queue puts the first class's requests first (FairKey).
"""
from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from raypd.engine.cache.block_allocator import BlockAllocator
from raypd.engine.cache.radix_cache import RadixCache
from raypd.engine.request import Request, RequestStatus
from raypd.engine.step_yield import Rank, RecentClasses
from raypd.protocol.fair_share import TenantShares
from raypd.protocol.queued_by_priority import MOST_URGENT, QueuedByPriority, summarize
from raypd.protocol.sampling_params import SamplingParams

# A waiting request's rank before the policy's own order, smallest first: its priority, whether its
# class yields (engine/step_yield.py: False for every request when one class is about), its tenant's
# standing (Virtual Token Counter), its tenant's requests in line (Scheduler.waiting_key).
FairKey = tuple[int, bool, float, int]


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    block_size: int = 16
    max_num_batched_tokens: int = 512
    chunked_prefill_size: int = 256  # <= 0: never split a prompt
    max_running_requests: int = 64
    schedule_policy: Literal["fcfs", "lpm", "srpt"] = "fcfs"
    enable_prefix_cache: bool = True
    srpt_aging_tokens_per_s: float = 256.0
    max_prefill_tokens_per_step: int | None = None  # None: prompts share the whole budget
    init_new_token_ratio: float = 0.7
    min_new_token_ratio: float = 0.1
    new_token_ratio_decay: float = 0.002
    lpm_max_waiting: int = 128  # past this many waiting requests, lpm sorting costs too much: fcfs
    yield_step_tokens: int = 0  # yielding steps (engine/step_yield.py); 0: nothing yields
    yield_window_s: float = 30.0


class Blocked(Enum):
    """Why the head of the waiting queue cannot start now."""
    BUDGET = "budget"  # the step's token budget is spent
    SLOT = "slot"      # max_running_requests are running
    MEMORY = "memory"  # its blocks, with the running requests' headroom, do not fit


@dataclass(slots=True)
class ScheduledRequest:
    request: Request
    start: int  # first position computed this step (= num_computed_tokens before the step)
    num_tokens: int

    @property
    def samples(self) -> bool:
        """Whether this step finishes the request's known tokens, so a new token is sampled."""
        return self.start + self.num_tokens == self.request.num_tokens


@dataclass(slots=True)
class ScheduledBatch:
    items: list[ScheduledRequest]
    retracted: list[Request]

    @property
    def num_tokens(self) -> int:
        return sum(x.num_tokens for x in self.items)

    def __bool__(self) -> bool:
        return bool(self.items)


class Scheduler:
    def __init__(self, config: SchedulerConfig, allocator: BlockAllocator, cache: RadixCache):
        self.config = config
        self.allocator = allocator
        self.cache = cache
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.new_token_ratio = config.init_new_token_ratio
        self.num_retractions = 0
        self.num_preemptions = 0
        self.shares = TenantShares()          # tokens computed per tenant
        self._backlogged: set[str] = set()    # tenants with requests here at the last sort
        # Yielding steps (engine/step_yield.py); chunking off, a prompt cannot be held to a share.
        self.recent = RecentClasses(config.yield_window_s) \
            if config.yield_step_tokens > 0 and config.chunked_prefill_size > 0 else None
        self._favoured: Rank | None = None  # within schedule(): the favoured class's rank, None: nothing yields
        self._yield_left: int | None = None  # within schedule(): the yielding prompts' tokens left in the step

    # -- queue operations -----------------------------------------------------------------------
    def add(self, req: Request) -> None:
        self.waiting.append(req)
        if self.recent is not None:
            self.recent.saw(req.params, time.monotonic())

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def queued_prompt_tokens(self) -> QueuedByPriority:
        """Prompt tokens not yet computed, by the priority a new request sees them at
        (protocol/queued_by_priority.py): a waiting request's at its own; a running one's (a prompt
        prefilled in chunks) at MOST_URGENT under fcfs and lpm, whose steps serve running prompts
        before admitting anyone, and at its own under srpt, whose steps order both by priority first.
        A waiting request's cached prefix counts until it is scheduled (it is not looked up here)."""
        by_own = self.config.schedule_policy == "srpt"
        return summarize([*((r.params.priority, _uncomputed_prompt(r)) for r in self.waiting),
                          *((r.params.priority if by_own else MOST_URGENT, _uncomputed_prompt(r))
                            for r in self.running)])

    def abort(self, req: Request) -> None:
        if req.status.is_finished:
            return
        if req in self.running:
            self.running.remove(req)
        elif req.status != RequestStatus.PREFILLED:
            self.waiting.remove(req)
        self._release(req, cache=self.config.enable_prefix_cache)
        req.status = RequestStatus.FINISHED_ABORTED

    def finish(self, req: Request, status: RequestStatus) -> None:
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status == RequestStatus.WAITING:  # retracted while its last token was in flight (engine/overlap.py)
            self.waiting.remove(req)
        self._release(req, cache=self.config.enable_prefix_cache)
        req.status = status

    def hold(self, req: Request) -> None:
        """A prefill-only request has its first token: it leaves the batch but keeps its blocks."""
        self.running.remove(req)
        req.status = RequestStatus.PREFILLED

    def add_running(self, req: Request) -> None:
        """Join a request whose prompt KV is already in its block table (a PD decode node's)."""
        req.status = RequestStatus.RUNNING
        self.running.append(req)

    def can_reserve(self, num_blocks: int) -> bool:
        """Whether num_blocks more blocks can be taken now and still leave the running requests
        their decode headroom (the same estimate admission uses)."""
        headroom = self._reserved_blocks(self.running)
        return self.allocator.num_free + self.cache.num_evictable_blocks - num_blocks >= headroom \
            and self._make_room(num_blocks)
    # -- the step -------------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        scheduled: dict[Request, ScheduledRequest] = {}
        retracted: list[Request] = []

        # Decodes before chunked prefills so a long prompt never starves token generation.
        decodes: list[Request] = []
        prefills: list[Request] = []
        for r in self.running:
            (decodes if len(r.token_ids) - r.num_computed_tokens == 1 else prefills).append(r)
        bs = cfg.block_size
        for req in decodes:
            # Most decode tokens fit the last block: no allocation, no retraction (the fast path,
            # which is what a step of hundreds of decodes spends its host time on); _run does the rest.
            if budget > 0 and req.status == RequestStatus.RUNNING and req.num_computed_tokens < len(req.block_table) * bs:
                scheduled[req] = ScheduledRequest(req, req.num_computed_tokens, 1)
                budget -= 1
            else:
                budget = self._run(req, budget, scheduled, retracted)
        # Prompt tokens (chunked prefills, admissions) take at most max_prefill_tokens_per_step of
        # what the decodes left: a decode node prefilling a prompt itself keeps its steps short. With
        # no decode in the step there is no token latency to protect: prompts get the whole budget.
        cap = cfg.max_prefill_tokens_per_step
        held_back = max(0, budget - cap) if cap is not None and scheduled else 0
        budget -= held_back
        self._favoured = self._favoured_rank()
        if self._favoured is None:
            budget = self._schedule_prompts(prefills, budget, scheduled, retracted)
        else:
            # Yielding steps (engine/step_yield.py): no yielding prompt token while a favoured prompt
            # may run; if none could (no slot, no memory), the yielding ones take their share after all.
            favoured_waits = not all(map(self._yields, prefills)) or not all(map(self._yields, self.waiting))
            self._yield_left = 0 if favoured_waits else cfg.yield_step_tokens
            decoding = len(scheduled)
            budget = self._schedule_prompts(prefills, budget, scheduled, retracted)
            if favoured_waits and not retracted and len(scheduled) == decoding:
                self._yield_left = cfg.yield_step_tokens
                budget = self._schedule_prompts(prefills, budget, scheduled, retracted)
            self._favoured = self._yield_left = None
        self.new_token_ratio = max(cfg.min_new_token_ratio, self.new_token_ratio - cfg.new_token_ratio_decay)
        return ScheduledBatch(items=list(scheduled.values()), retracted=retracted)

    def _schedule_prompts(self, prefills: list[Request], budget: int, scheduled: dict[Request, ScheduledRequest],
                          retracted: list[Request]) -> int:
        """The prompt tokens of the step, by the policy: the running prefills', then admissions."""
        if self.config.schedule_policy == "srpt":
            return self._shortest_first(prefills, budget, scheduled, retracted)
        for req in prefills:
            budget = self._run(req, budget, scheduled, retracted)
        return budget if retracted else self._admit(budget, scheduled)

    def _favoured_rank(self) -> Rank | None:
        """The rank of the favoured class (engine/step_yield.py) for this step, or None: nothing yields."""
        return None if self.recent is None else self.recent.favoured(time.monotonic())

    def _yields(self, req: Request) -> bool:
        """Whether `req`'s prompt yields in this step (RecentClasses.yields)."""
        return self.recent is not None and self.recent.yields(req.params, self._favoured)

    def _spend_yield(self, req: Request, n: int) -> None:
        if self._yield_left is not None and self._yields(req):
            self._yield_left -= n

    def _run(self, req: Request, budget: int, scheduled: dict[Request, ScheduledRequest],
             retracted: list[Request]) -> int:
        """Schedule a running request's next tokens, retracting the newest running ones while the
        pool is dry (possibly `req` itself); the budget left."""
        if req.status != RequestStatus.RUNNING:  # retracted earlier in this step
            return budget
        n = self._chunk(req, budget)
        if n <= 0:
            return budget
        need = self._blocks_needed(req, n)  # 0 for most decode tokens: the last block has room
        while need and not self._make_room(need):
            victim = self.running[-1]
            if victim in scheduled:
                budget += scheduled.pop(victim).num_tokens
                self._undo_growth(victim)
            self._retract(victim)
            retracted.append(victim)
            if victim is req:
                return budget
        if need:
            req.block_table.extend(self.allocator.allocate(need))
        scheduled[req] = ScheduledRequest(req, req.num_computed_tokens, n)
        self._spend_yield(req, n)
        return budget - n

    def _shortest_first(self, prefills: list[Request], budget: int, scheduled: dict[Request, ScheduledRequest],
                        retracted: list[Request]) -> int:
        """srpt: running prefills and waiting prompts take the budget in order of aged remaining work.
        Admission stops at the first waiting prompt that cannot start (as in _admit, so the order
        holds) and after any retraction; running prefills go on being scheduled."""
        key = self._srpt_keys(prefills)
        running = sorted(prefills, key=key.__getitem__)
        self.waiting = deque(sorted(self.waiting, key=key.__getitem__))  # stable: ties keep arrival order
        i, admitting = 0, not retracted
        while budget > 0:
            can_admit = admitting and bool(self.waiting)
            if i < len(running) and (not can_admit or key[running[i]] <= key[self.waiting[0]]):
                budget = self._run(running[i], budget, scheduled, retracted)
                i += 1
                admitting = admitting and not retracted
            elif can_admit:
                preempted = self.num_preemptions
                left = self._admit_next(budget, scheduled)
                if left is None:
                    admitting = False
                else:
                    budget = left
                    if self.num_preemptions != preempted:  # the preempted request waits now: it needs a key
                        key.update(self._srpt_keys([]))
                        self.waiting = deque(sorted(self.waiting, key=key.__getitem__))
            else:
                break
        return budget

    def _srpt_keys(self, prefills: list[Request]) -> dict[Request, tuple[int, bool, float, int, float]]:
        """Each prompt's FairKey (priority, whether its class yields, its tenant's counter and requests
        waiting), then its uncomputed tokens (a waiting one's cached prefix counted as computed, when
        the queue is short enough to look it up) less its aging credit."""
        cfg = self.config
        now, bs = time.monotonic(), cfg.block_size
        look_up = cfg.enable_prefix_cache and len(self.waiting) <= cfg.lpm_max_waiting
        self._lift_new_tenants()
        fair = self._fair_key(r.params for r in self.waiting)
        keys = {}
        for r in [*prefills, *self.waiting]:
            todo = r.num_tokens - r.num_computed_tokens
            if look_up and r.status == RequestStatus.WAITING and r.prefix_node is None:
                todo -= self.cache.match_prefix(r.token_ids, (r.num_tokens - 1) // bs).num_blocks * bs
            keys[r] = (*fair(r.params), todo - cfg.srpt_aging_tokens_per_s * (now - r.queued_at))
        return keys

    def update(self, batch: ScheduledBatch) -> None:
        """Account the KV computed by `batch`, and its tokens to their tenants; the caller appends
        sampled tokens afterwards."""
        computed: dict[str, int] = {}
        now = time.monotonic()
        for item in batch.items:
            req = item.request
            req.num_computed_tokens += item.num_tokens
            tenant = req.params.tenant
            computed[tenant] = computed.get(tenant, 0) + item.num_tokens
            if self.recent is not None:
                self.recent.charge(req.params, item.num_tokens, now)
            # Publish prompt blocks as soon as they exist so concurrent requests can share them.
            if self.config.enable_prefix_cache and req.num_computed_tokens <= req.num_prompt_tokens:
                self._cache_computed(req)
        for tenant, n in computed.items():
            self.shares.charge(tenant, n, 1.0, self._backlogged)

    # -- admission ------------------------------------------------------------------------------
    def _admit(self, budget: int, scheduled: dict[Request, ScheduledRequest]) -> int:
        self._sort_waiting()
        while self.waiting and budget > 0:
            left = self._admit_next(budget, scheduled)
            if left is None:
                break
            budget = left
        return budget

    def _admit_next(self, budget: int, scheduled: dict[Request, ScheduledRequest]) -> int | None:
        """_admit_one, preempting for the head when a less urgent running request holds the slot or
        memory it lacks: the budget left (after a preemption the head is tried again next), or None
        when nothing more starts in this step."""
        left = self._admit_one(budget, scheduled)
        if not isinstance(left, Blocked):
            return left
        freed = None if left is Blocked.BUDGET else self._preempt_for(self.waiting[0], scheduled)
        return None if freed is None else budget + freed

    def _admit_one(self, budget: int, scheduled: dict[Request, ScheduledRequest]) -> int | Blocked:
        """Start the head of the waiting queue with up to `budget` tokens: the budget left, or why it
        cannot start now."""
        if len(self.running) >= self.config.max_running_requests:
            return Blocked.SLOT
        req = self.waiting[0]
        self._match_prefix(req)
        n = self._chunk(req, budget)
        # With chunking off a prompt may exceed the budget, but only as the step's only work.
        if n <= 0 or (n > budget and scheduled):
            self._drop_prefix(req)
            return Blocked.BUDGET
        need = self._blocks_needed(req, n)
        # Alone, a request always fits (checked when it was added), so it needs no headroom.
        headroom = self._reserved_blocks(self.running + [req]) if self.running else 0
        if self.allocator.num_free + self.cache.num_evictable_blocks - need < headroom \
                or not self._make_room(need):
            self._drop_prefix(req)
            return Blocked.MEMORY
        self.waiting.popleft()
        req.status = RequestStatus.RUNNING
        if req.num_cached_tokens is None:
            req.num_cached_tokens = req.num_computed_tokens
            req.first_scheduled_at = time.time()
        self.running.append(req)
        self._grow(req, n)
        scheduled[req] = ScheduledRequest(req, req.num_computed_tokens, n)
        self._spend_yield(req, n)
        return budget - n

    def _sort_waiting(self) -> None:
        """Priority first, then the tenant's counter and its requests waiting, then lpm's longest
        cached prefix; a stable sort keeps arrival order (and a preempted or retracted request first)
        among equals."""
        cfg = self.config
        if not self.waiting:  # nothing to order (and no tenant to lift: none came)
            return
        lpm = cfg.schedule_policy == "lpm" and cfg.enable_prefix_cache and len(self.waiting) <= cfg.lpm_max_waiting
        self._lift_new_tenants()
        head = self.waiting[0].params
        if not lpm and all(r.params.priority == head.priority and r.params.tenant == head.tenant for r in self.waiting):
            return
        bs = cfg.block_size
        match = {id(r): self.cache.match_prefix(r.token_ids, (r.num_tokens - 1) // bs).num_blocks
                 for r in self.waiting} if lpm else {}
        fair = self._fair_key(r.params for r in self.waiting)
        self.waiting = deque(sorted(self.waiting, key=lambda r: (*fair(r.params), -match.get(id(r), 0))))

    def waiting_key(self, outside: Iterable[SamplingParams] = ()) -> Callable[[SamplingParams], FairKey]:
        """The rank this node's waiting queue gives a request with these params, before the policy's
        own order (arrival, lpm's cached prefix, srpt's remaining work) decides among equals: for a
        queue a node keeps in front of the engine (`outside`: a decode node's requests waiting for KV
        memory), which serves in this order, and for displaced_by()."""
        self._lift_new_tenants()
        return self._fair_key([*(r.params for r in self.waiting), *outside])

    def displaced_by(self, newcomer: SamplingParams, owned: Container[str],
                     outside: Sequence[tuple[str, SamplingParams]] = ()) -> str | None:
        """At a node's full waiting bound: the id of the request a newcomer with these params takes the
        place of (the node ends that one as refused for capacity and takes the newcomer), or None: the
        newcomer is refused. The candidates are the waiting requests that never started (holding no
        block, nothing computed: Request.started) and that `owned` holds (the duty asking can end
        them), then `outside` (id, params): requests the node queues in front of the engine, holding
        nothing, in their order. The one displaced is the candidate that would start last by
        waiting_key(), the later in line among equals, and only if the newcomer ranks strictly before
        it: a newcomer that ties would start after it (it came later), so it is refused. The newcomer
        counts in its tenant's line, as it will once it waits."""
        key = self.waiting_key([*(p for _, p in outside), newcomer])
        candidates = [*((r.request_id, r.params) for r in self.waiting if not r.started and r.request_id in owned),
                      *outside]
        last: tuple[str, FairKey] | None = None
        for rid, params in candidates:
            k = key(params)
            if last is None or k >= last[1]:
                last = (rid, k)
        return last[0] if last is not None and key(newcomer) < last[1] else None

    def _fair_key(self, line: Iterable[SamplingParams]) -> Callable[[SamplingParams], FairKey]:
        """FairKey by params: priority first; then the classes that do not yield before those that do
        (the class served at the lowest rate lately goes first: the order the steps' yielding
        serves, so a request of that class neither waits behind a flood's queue nor is displaced by
        it); then the tenant's counter, the tenant this node has computed the fewest tokens for first
        (a tenant with nothing here yet at the level it will be lifted to: _standing); then its
        requests among `line`, the requests being ordered (a tie between tenants goes to the one
        with fewer waiting)."""
        in_line = Counter(p.tenant for p in line)
        standing: dict[str, float] = {}
        favoured = self._favoured_rank()
        recent = self.recent

        def key(p: SamplingParams) -> FairKey:
            s = standing.get(p.tenant)
            if s is None:
                s = standing[p.tenant] = self._standing(p.tenant)
            return p.priority, recent is not None and recent.yields(p, favoured), s, in_line[p.tenant]
        return key

    def _standing(self, tenant: str) -> float:
        """The tenant's counter as the queue ranks it. One with requests here (at the last lift) has its
        own; one without is ranked where TenantShares.start_waiting will lift it once it comes (asked of
        a copy of the counters: ranking a newcomer, maybe refused, changes nobody's counter)."""
        if tenant in self._backlogged:
            return self.shares.counter(tenant)
        trial = TenantShares()
        trial.counters = {t: self.shares.counter(t) for t in (tenant, *self._backlogged)}
        trial.start_waiting(tenant, self._backlogged)
        return trial.counter(tenant)

    def _lift_new_tenants(self) -> None:
        """Tenants with requests here (waiting or running) that had none at the last sort are lifted
        to the smallest counter of those that had (protocol/fair_share.py): time away from this node
        banks no credit."""
        present = {r.params.tenant for r in self.waiting}
        present.update(r.params.tenant for r in self.running)
        if present != self._backlogged:
            before = present & self._backlogged
            for tenant in present - self._backlogged:
                self.shares.start_waiting(tenant, before)
            self._backlogged = present

    def _preempt_for(self, head: Request, scheduled: dict[Request, ScheduledRequest]) -> int | None:
        """Make room for `head`: the least urgent running request that is less urgent than it (the
        newest among equals) goes back to waiting (_requeue). Returns the tokens it had in this step,
        or None when no running request is less urgent."""
        victim = None
        for r in reversed(self.running):
            if r.params.priority > head.params.priority and (victim is None or r.params.priority > victim.params.priority):
                victim = r
        if victim is None:
            return None
        freed = 0
        if victim in scheduled:
            freed = scheduled.pop(victim).num_tokens
            self._undo_growth(victim)
        self._requeue(victim)
        self.num_preemptions += 1
        self._sort_waiting()  # the head is the urgent request again; the victim first of its priority
        return freed

    def _reserved_blocks(self, reqs: list[Request]) -> int:
        tokens = sum(int(r.remaining_output_tokens * self.new_token_ratio) for r in reqs)
        return -(-tokens // self.config.block_size)

    # -- memory ---------------------------------------------------------------------------------
    def _chunk(self, req: Request, budget: int) -> int:
        if self._yield_left is not None and self._yields(req):
            budget = min(budget, self._yield_left)
            if budget <= 0:
                return 0
        n = min(req.num_tokens - req.num_computed_tokens, budget)
        if self.config.chunked_prefill_size > 0:
            n = min(n, self.config.chunked_prefill_size)
        elif req.num_computed_tokens == 0 or req.num_tokens - req.num_computed_tokens > 1:
            # Chunking off: a prompt goes in one piece, over the budget if it is alone in the step.
            n = req.num_tokens - req.num_computed_tokens
        return n

    def _blocks_needed(self, req: Request, n: int) -> int:
        bs = self.config.block_size
        return max(0, -(-(req.num_computed_tokens + n) // bs) - len(req.block_table))

    def _make_room(self, need: int) -> bool:
        short = need - self.allocator.num_free
        if short > 0 and self.config.enable_prefix_cache:
            self.cache.evict(short)
        return self.allocator.num_free >= need

    def _grow(self, req: Request, n: int) -> None:
        req.block_table.extend(self.allocator.allocate(self._blocks_needed(req, n)))

    def _undo_growth(self, req: Request) -> None:
        """Return blocks allocated this step beyond what the request's computed tokens use."""
        bs = self.config.block_size
        keep = max(-(-req.num_computed_tokens // bs), 0)
        extra = req.block_table[keep:]
        del req.block_table[keep:]
        self.allocator.decref(extra)

    def _retract(self, req: Request) -> None:
        """The pool ran dry mid-step: the request goes back (_requeue), and admission keeps more
        headroom from now on."""
        self._requeue(req)
        self.num_retractions += 1
        self.new_token_ratio = self.config.init_new_token_ratio

    def _requeue(self, req: Request) -> None:
        """A running request back to the front of the waiting queue, its computed full blocks left in
        the prefix cache: it is recomputed from there when it starts again."""
        self.running.remove(req)
        self._release(req, cache=self.config.enable_prefix_cache)
        req.status = RequestStatus.WAITING
        req.num_retractions += 1
        self.waiting.appendleft(req)

    # -- prefix cache ---------------------------------------------------------------------------
    def _match_prefix(self, req: Request) -> None:
        if not self.config.enable_prefix_cache or req.prefix_node is not None:
            return
        # Leave at least one token to compute: its logits give the next token. Blocks evicted to the
        # KV tier come back here (radix_cache.match_and_load), at admission only.
        m = self.cache.match_and_load(req.token_ids, (req.num_tokens - 1) // self.config.block_size)
        self.cache.lock(m.node)
        self.allocator.incref(m.blocks)
        req.prefix_node = m.node
        req.block_table = list(m.blocks)
        req.num_computed_tokens = len(m.blocks) * self.config.block_size

    def _drop_prefix(self, req: Request) -> None:
        """Undo _match_prefix for a request that stays waiting."""
        if req.prefix_node is None:
            return
        self._release(req, cache=False)

    def _cache_computed(self, req: Request) -> None:
        computed = req.token_ids[:req.num_computed_tokens]
        node, canonical = self.cache.insert(computed, req.block_table)
        for i, block in enumerate(canonical):
            if block != req.block_table[i]:  # another request stored this prefix first: share it
                self.allocator.incref([block])
                self.allocator.decref([req.block_table[i]])
                req.block_table[i] = block
        self.cache.lock(node)
        if req.prefix_node is not None:
            self.cache.unlock(req.prefix_node)
        req.prefix_node = node

    def _release(self, req: Request, cache: bool) -> None:
        """Give back everything the request holds; keep its computed full blocks cached if asked."""
        if cache and req.num_computed_tokens >= self.config.block_size:
            self._cache_computed(req)
        self.allocator.decref(req.block_table)
        if req.prefix_node is not None:
            self.cache.unlock(req.prefix_node)
        req.prefix_node = None
        req.block_table = []
        req.num_computed_tokens = 0


def _uncomputed_prompt(req: Request) -> int:
    return req.num_prompt_tokens - min(req.num_computed_tokens, req.num_prompt_tokens)
