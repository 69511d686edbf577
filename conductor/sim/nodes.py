"""Simulated nodes. Times are virtual seconds; token counts are in the run's token unit.

SimPrefillNode: one request at a time in FIFO order (prefill is compute-bound, so batching
  changes little for long prompts); at start it matches its own LRU cache (what it *really* holds,
  which may differ from what the Conductor predicted); at the end it caches the prompt's blocks
  (KV events) and sends the KV to the decode node through its NIC, which serves transfers FIFO.
SimDecodeNode: continuous batching as a fluid - every running sequence advances at one token per
  step, a step of b sequences over c context tokens takes profile.decode_step(b, c); a request
  waits when the batch or the KV capacity is full. Events are only joins and completions. On the
  Conductor's local path it also prefills prompts itself, first come first served, `local_budget`
  prompt tokens per step while it decodes (each such step costs that chunk's prefill time on top;
  with nothing decoding, the whole prompt at once, as the engine does); a prompt done
  there has its first token and joins the batch like one whose KV landed.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from raypd.conductor.sim.cache import BlockLRU
from raypd.conductor.sim.profiles import HardwareProfile
from raypd.conductor.sim.workload import SimRequest
from raypd.protocol.kv_events import KVEvent


@dataclass(slots=True)
class Outcome:
    """What one request went through."""
    req: SimRequest
    arrival: float = 0.0           # virtual arrival time (trace time / the run's time scale)
    prefill: str = ""
    decode: str = ""
    branch: str = ""
    predicted_cached: int = 0
    cached: int = 0                # tokens the prefill node really reused (fetched ones included)
    fetched: int = 0
    prefill_start: float = 0.0
    prefill_end: float = 0.0
    first_token: float = 0.0       # KV landed on the decode node with the first token
    finished: float = 0.0
    decode_join: float = 0.0

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def tpot(self) -> float | None:
        n = self.req.output_len
        return (self.finished - self.first_token) / (n - 1) if n > 1 else None


@dataclass(slots=True)
class Job:
    out: Outcome
    decode: SimDecodeNode
    n_new: int = 0
    est_new: int = 0     # uncached tokens counted into the queue at enqueue time


class Nic:
    """A node's outgoing link, serving transfers one after another."""

    def __init__(self):
        self.free_at = 0.0
        self.bytes_sent = 0

    def send(self, now: float, seconds: float, nbytes: float) -> float:
        start = max(now, self.free_at)
        self.free_at = start + seconds
        self.bytes_sent += int(nbytes)
        return self.free_at


class SimPrefillNode:
    def __init__(self, name: str, host: str, profile: HardwareProfile, block_size: int):
        self.name, self.host, self.profile, self.block_size = name, host, profile, block_size
        self.events: list[KVEvent] = []
        self.cache = BlockLRU(profile.prefill_cache_tokens // block_size, block_size, self.events.append)
        self.queue: deque[Job] = deque()
        self.current: Job | None = None
        self.nic = Nic()
        self.queued_tokens = 0        # uncomputed prompt tokens, queued and running
        self.speed_ewma = 0.0
        self.step_ewma = 0.0
        self.busy_s = 0.0

    def enqueue(self, job: Job) -> None:
        """Queued load counts only what the cache will not serve (a radix match at enqueue); the
        Conductor's queue estimate assumes nodes report it that way."""
        req = job.out.req
        usable = req.block_hashes(self.block_size)[:(req.input_len - 1) // self.block_size]
        job.est_new = req.input_len - self.cache.match(usable, touch=False) * self.block_size
        self.queue.append(job)
        self.queued_tokens += job.est_new

    def start_next(self, now: float) -> tuple[Job, float] | None:
        """Begin the next job; returns it and its finish time."""
        if self.current is not None or not self.queue:
            return None
        job = self.queue.popleft()
        req = job.out.req
        hashes = req.block_hashes(self.block_size)
        usable = hashes[:(req.input_len - 1) // self.block_size]
        cached = self.cache.match(usable) * self.block_size
        job.n_new = req.input_len - cached
        self.queued_tokens += job.n_new - job.est_new    # eviction since enqueue, or a fetch landed
        job.out.cached = cached
        job.out.prefill_start = now
        self.current = job
        dur = self.profile.prefill_time(job.n_new, cached)
        self.busy_s += dur
        return job, now + dur

    def finish(self, now: float) -> Job:
        job, self.current = self.current, None
        assert job is not None, "finish() without a started job"
        req = job.out.req
        self.queued_tokens -= job.n_new
        dur = now - job.out.prefill_start
        speed = job.n_new / dur if dur > 0 else 0.0
        a = 0.2
        self.speed_ewma = speed if not self.speed_ewma else (1 - a) * self.speed_ewma + a * speed
        self.step_ewma = dur if not self.step_ewma else (1 - a) * self.step_ewma + a * dur
        hashes = req.block_hashes(self.block_size)
        toks = req.token_ids()
        bs = self.block_size
        self.cache.insert(hashes, lambda s, e: toks[s * bs:e * bs])
        job.out.prefill_end = now
        return job

    def hold_prefix(self, hashes: list[int], tokens: list[int]) -> int:
        """Blocks copied in from another node (fetch or migration)."""
        bs = self.block_size
        return self.cache.insert(hashes, lambda s, e: tokens[s * bs:e * bs])


@dataclass(slots=True)
class _Seq:
    out: Outcome
    remaining: float
    ctx: float


@dataclass(slots=True)
class _LocalPrompt:
    out: Outcome
    remaining: float      # prompt tokens still to compute here


class SimDecodeNode:
    def __init__(self, name: str, host: str, profile: HardwareProfile, block_size: int, unit: int,
                 local_budget: int = 32):
        self.name, self.host, self.profile, self.block_size, self.unit = name, host, profile, block_size, unit
        self.local_budget = local_budget
        self.local: deque[_LocalPrompt] = deque()
        self.running: list[_Seq] = []
        self.waiting: deque[_Seq] = deque()
        self.inflight = 0               # KV transfers on their way here
        self.kv_used = 0.0
        self.ctx_sum = 0.0
        self.last = 0.0
        self.version = 0                # invalidates stale completion events
        self.step_s = 0.0

    def _step(self) -> float:
        p = self.profile
        step = p.decode_step(len(self.running), self.ctx_sum) if self.running else p.decode_base_s
        if self.local:
            step += p.prefill_time(int(self._chunk()), 0)
        return step

    def _chunk(self) -> float:
        """Prompt tokens a step computes: the budget while sequences decode, else all that is left
        of the head prompt (the engine caps only steps that also decode)."""
        head = self.local[0].remaining
        return min(self.local_budget, head) if self.running else head

    def _steps_to_next_event(self) -> float:
        """Steps until a running sequence finishes or the local prompt at the head is computed."""
        m = min((s.remaining for s in self.running), default=float("inf"))
        if self.local:
            m = min(m, self.local[0].remaining / self._chunk())
        return m

    def advance(self, now: float) -> list[Outcome]:
        """Progress the batch (and a local prompt) to `now`; returns the requests that finished."""
        done: list[Outcome] = []
        t = self.last
        while (self.running or self.local) and t < now:
            step = self._step()
            m = self._steps_to_next_event()
            dt = m * step
            if t + dt <= now + 1e-12:
                t += dt
                self._progress(m)
                keep = []
                for s in self.running:
                    if s.remaining <= 1e-9:
                        s.out.finished = t
                        done.append(s.out)
                        self.kv_used -= s.ctx
                        self.ctx_sum -= s.ctx
                    else:
                        keep.append(s)
                self.running = keep
                if self.local and self.local[0].remaining <= 1e-9:
                    out = self.local.popleft().out
                    out.first_token = out.prefill_end = t
                    if out.req.output_len <= 1:
                        out.finished = t
                        done.append(out)
                    else:
                        self._join(out, t)
                self._admit(t)
            else:
                self._progress((now - t) / step)
                t = now
        self.last = now
        self.step_s = self._step() if self.running else 0.0
        return done

    def _progress(self, steps: float) -> None:
        for s in self.running:
            s.remaining -= steps
        if self.local:
            self.local[0].remaining -= steps * self._chunk()

    def prefill_locally(self, out: Outcome, now: float) -> None:
        """The Conductor's local path: compute the prompt here (the caller advanced to `now`)."""
        out.prefill_start = now
        self.local.append(_LocalPrompt(out, float(out.req.input_len)))

    @property
    def queued_prefill_tokens(self) -> int:
        return int(sum(p.remaining for p in self.local))

    def arrive(self, out: Outcome, now: float) -> None:
        """KV landed: the first token is out; the rest is decoded here."""
        self.inflight -= 1
        if out.req.output_len <= 1:
            out.finished = now
            return
        self._join(out, now)
        self._admit(now)

    def _join(self, out: Outcome, now: float) -> None:
        ctx = out.req.input_len + out.req.output_len / self.unit / 2   # mean context while decoding
        self.waiting.append(_Seq(out, float(out.req.output_len - 1), ctx))

    def _admit(self, now: float) -> None:
        cap = self.profile.decode_kv_tokens
        while self.waiting and len(self.running) < self.profile.max_decode_batch and \
                (self.kv_used + self.waiting[0].ctx <= cap or not self.running):
            s = self.waiting.popleft()
            s.out.decode_join = now
            self.running.append(s)
            self.kv_used += s.ctx
            self.ctx_sum += s.ctx

    def next_completion(self) -> float | None:
        if not self.running and not self.local:
            return None
        return self.last + self._steps_to_next_event() * self._step()

    @property
    def free_tokens(self) -> float:
        return max(self.profile.decode_kv_tokens - self.kv_used, 0.0)
