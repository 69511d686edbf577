"""Request streams for the simulator. A request's prompt is a sequence of content blocks (the
Mooncake trace's hash_ids, or generated ids): block b holds tokens b*T .. b*T+T-1, so equal block
ids mean equal tokens and the engine's chained hashes see exactly the trace's reuse."""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from raypd.protocol.block_hash import chained_block_hashes

TRACE_BLOCK_TOKENS = 512   # the Mooncake traces' hash_ids each cover 512 tokens


@dataclass(slots=True)
class SimRequest:
    request_id: str
    arrival_s: float
    input_len: int
    output_len: int
    block_ids: tuple[int, ...]     # content of each block; the last may be partial
    block_tokens: int
    _tokens: list[int] | None = field(default=None, repr=False)
    _hashes: list[int] | None = field(default=None, repr=False)

    def token_ids(self) -> list[int]:
        if self._tokens is None:
            t = self.block_tokens
            toks: list[int] = []
            for b in self.block_ids:
                toks.extend(range(b * t, b * t + t))
            self._tokens = toks[:self.input_len]
        return self._tokens

    def block_hashes(self, block_size: int) -> list[int]:
        """Chained hashes of every full block of the prompt (what a node caches after prefill)."""
        if self._hashes is None:
            self._hashes = chained_block_hashes(self.token_ids(), block_size)
        return self._hashes

    def drop_tokens(self) -> None:
        """Free the materialized lists once the request no longer needs them (memory of long runs)."""
        self._tokens = self._hashes = None


def load_mooncake_trace(path: str | Path, *, scale: float = 1.0, scale_output: bool = True,
                        max_requests: int | None = None, start: int = 0) -> list[SimRequest]:
    """The FAST'25 conversation trace (jsonl: timestamp ms, input_length, output_length, hash_ids).
    `scale` shrinks prompt lengths (1/32 maps each 512-token block to 16 tokens: the size the CPU
    engine runs, or, with a profile scaled by 32, a cheaper hashing unit for the GPU setting);
    output lengths shrink too unless scale_output is False. Arrival times start at 0 (the simulator
    compresses time for rate sweeps)."""
    block_tokens = max(1, round(TRACE_BLOCK_TOKENS * scale))
    out: list[SimRequest] = []
    with open(path) as f:
        for i, line in enumerate(f):
            if i < start:
                continue
            if max_requests is not None and len(out) >= max_requests:
                break
            r = json.loads(line)
            n_in = max(1, math.ceil(r["input_length"] * scale))
            n_out = max(1, round(r["output_length"] * (scale if scale_output else 1.0)))
            n_blocks = math.ceil(n_in / block_tokens)
            out.append(SimRequest(f"t{i}", r["timestamp"] / 1000.0, n_in, n_out,
                                  tuple(r["hash_ids"][:n_blocks]), block_tokens))
    t0 = out[0].arrival_s if out else 0.0
    for r in out:
        r.arrival_s -= t0
    return out


def shared_prefix_workload(*, groups: int = 64, prompts_per_group: int = 16, prefix_len: int = 2048,
                           question_len: int = 128, output_len: int = 256, rate: float = 1.0,
                           block_tokens: int = 16, hot_share: float = 0.0, hot_after: float = 0.0,
                           seed: int = 0) -> list[SimRequest]:
    """SGLang's generated-shared-prefix shape: `groups` system prompts of prefix_len tokens, each
    followed by distinct questions; requests shuffled, Poisson arrivals at `rate` per second.
    With hot_share > 0 that share of requests goes to group 0 (one very hot prefix) and the total
    count stays groups x prompts_per_group. With hot_after in (0, 1) the skew starts only after
    that share of the requests (a prefix turning hot on a warm cluster)."""
    rng = random.Random(seed)
    next_id = 1_000_000_000 // block_tokens    # away from trace ids; token ids stay < 2**32
    prefix_blocks = []
    for _ in range(groups):
        n = math.ceil(prefix_len / block_tokens)
        prefix_blocks.append(tuple(range(next_id, next_id + n)))
        next_id += n
    total = groups * prompts_per_group
    if hot_share > 0:
        start = int(total * hot_after)
        members = [rng.randrange(0, groups) if i < start else (0 if rng.random() < hot_share else rng.randrange(1, groups))
                   for i in range(total)]
    else:
        members = [g for g in range(groups) for _ in range(prompts_per_group)]
        rng.shuffle(members)
    out, t = [], 0.0
    for i, g in enumerate(members):
        t += rng.expovariate(rate)
        nq = math.ceil(question_len / block_tokens)
        q = tuple(range(next_id, next_id + nq))
        next_id += nq
        # prefix_len is a whole number of blocks in practice; the question follows it
        out.append(SimRequest(f"g{g}-{i}", t, prefix_len + question_len, output_len, prefix_blocks[g] + q,
                              block_tokens))
    return out


def reusable_share(requests: list[SimRequest], block_size: int) -> float:
    """Share of prompt tokens whose block appeared in an earlier request at the same position of
    the same chain (an infinite cache's hit rate, engine rule: the last token is never reused)."""
    seen: set[int] = set()
    hit = tot = 0
    for r in sorted(requests, key=lambda r: r.arrival_s):
        hashes = r.block_hashes(block_size)
        usable = (r.input_len - 1) // block_size
        n = 0
        for h in hashes[:usable]:
            if h not in seen:
                break
            n += 1
        hit += n * block_size
        tot += r.input_len
        seen.update(hashes)
        r.drop_tokens()
    return hit / tot if tot else 0.0
