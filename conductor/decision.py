"""A routing decision and the inputs it was made from, so any choice can be explained afterwards;
and the bounded log of recent decisions."""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import asdict, dataclass, field
from typing import Any

from raypd.protocol.sampling_params import DEFAULT_PRIORITY


@dataclass(slots=True)
class CandidateEstimate:
    """One prefill candidate as the policy saw it."""
    node: str
    cached_tokens: int          # local match
    queued_tokens: float        # reported + routed since the report, that the request waits behind
    queue_s: float = 0.0
    prefill_s: float = 0.0
    fetch_tokens: int = 0       # tokens pulled from `fetch_from` before prefill (Branch B)
    fetch_from: str | None = None
    fetch_s: float = 0.0
    send_s: float = 0.0         # KV to the paired decode node
    ttft_s: float = 0.0
    decode_node: str | None = None
    # The run past cached_tokens the node holds in its tiers below the pool (host, disk), what
    # loading it into the pool costs, and whether the estimate loads it (else it computes it)
    tier_tokens: int = 0
    tier_load_s: float = 0.0
    tier_used: bool = False
    tiers: dict[str, int] = field(default_factory=dict)   # tier_tokens by tier name
    # Queued there too, but less urgent than the request: it overtakes them, so queue_s leaves them out
    queued_behind_tokens: float = 0.0


@dataclass(slots=True)
class DecodeEstimate:
    node: str
    load: float                 # sequences held or arriving
    tbt_s: float                # estimated time per output token with this request added
    send_s: float               # KV transfer time from the chosen prefill node
    score: float


@dataclass(slots=True)
class PrefixFetch:
    """Pull `num_tokens` of prefix from `source` into `target` before this request's prefill
    (Mooncake's Branch B: the remote match is long enough to beat recomputing)."""
    source: str
    target: str
    num_tokens: int             # prefix length the target holds after the fetch
    from_tokens: int            # what the target already held
    est_s: float


@dataclass(slots=True)
class RouteDecision:
    request_id: str
    policy: str
    branch: str                 # which arm of the policy decided (e.g. "local", "fetch", "cold")
    prefill_node: str
    decode_node: str
    prompt_tokens: int
    predicted_cached_tokens: int    # on the prefill node when it starts, fetch or tier loads included
    local_cached_tokens: int
    est_ttft_s: float
    est_tbt_s: float = 0.0
    best_match_tokens: int = 0
    best_match_nodes: list[str] = field(default_factory=list)
    num_prefill_candidates: int = 0
    num_decode_candidates: int = 0
    candidates: list[CandidateEstimate] = field(default_factory=list)      # the best few
    decode_candidates: list[DecodeEstimate] = field(default_factory=list)
    fetch: PrefixFetch | None = None
    migration: Any = None           # a MigrationPlan this request triggered, if any
    rejected: str = ""              # "ttft" / "tbt" when admission refused it
    # "split": prefill_node computes the prompt and sends its KV to decode_node; "local": decode_node
    # (named as prefill_node too) prefills it itself (split_or_local.py; `local` holds the inputs)
    path: str = "split"
    local: Any = None               # split_or_local.LocalEstimate, when the local path was weighed
    decided_at: float = 0.0
    latency_s: float = 0.0
    priority: int = DEFAULT_PRIORITY    # the request's: its queue estimates count the work served before it

    def to_dict(self) -> dict:
        d = asdict(self)
        for name in ("migration", "local"):
            if getattr(self, name) is not None:
                d[name] = asdict(getattr(self, name))
        return d

    def explain(self) -> str:
        target = f"local on {self.decode_node}" if self.path == "local" else \
            f"prefill {self.prefill_node}, decode {self.decode_node}"
        lines = [f"{self.request_id}: {self.policy}/{self.branch} -> {target}; cached {self.predicted_cached_tokens}/{self.prompt_tokens} "
                 f"(best {self.best_match_tokens} on {self.best_match_nodes[:4]}), "
                 f"TTFT ~{self.est_ttft_s * 1e3:.1f} ms, TBT ~{self.est_tbt_s * 1e3:.1f} ms, priority {self.priority}"]
        for c in self.candidates:
            tier = ""
            if c.tier_tokens:
                split = " ".join(f"{k} {v}" for k, v in c.tiers.items())
                tier = (f" tier {c.tier_tokens} ({split}) load {c.tier_load_s * 1e3:.1f}"
                        f"{'' if c.tier_used else ' (not used)'}")
            lines.append(f"  P {c.node}: cached {c.cached_tokens}{tier} fetch {c.fetch_tokens} queue "
                         f"{c.queue_s * 1e3:.1f}{_passed(c.queued_tokens, c.queued_behind_tokens)} prefill "
                         f"{c.prefill_s * 1e3:.1f} send {c.send_s * 1e3:.1f} -> {c.ttft_s * 1e3:.1f} ms")
        for dc in self.decode_candidates:
            lines.append(f"  D {dc.node}: load {dc.load:g} tbt {dc.tbt_s * 1e3:.1f} send {dc.send_s * 1e3:.1f}")
        if self.fetch:
            lines.append(f"  fetch {self.fetch.num_tokens - self.fetch.from_tokens} tokens from {self.fetch.source}")
        if (lo := self.local) is not None:
            lines.append(f"  L {lo.node}: cached {lo.cached_tokens} queued {lo.queued_tokens:g}"
                         f"{_passed(lo.queued_tokens, lo.queued_behind_tokens)} running {lo.running:g}"
                         f" steps {lo.steps} -> {lo.ttft_s * 1e3:.1f} ms, tbt {lo.tbt_s * 1e3:.1f} ms, tpot cost "
                         f"{lo.tpot_cost_s * 1e3:.1f} ms vs split {lo.split_ttft_s * 1e3:.1f} ms "
                         f"(handoff {lo.split_handoff_s * 1e3:.1f}): "
                         f"{'local' if lo.chosen else 'split (' + lo.why + ')'}")
        if self.migration is not None:
            lines.append(f"  migration {self.migration.source} -> {self.migration.target}")
        if self.rejected:
            lines.append(f"  REJECTED ({self.rejected})")
        return "\n".join(lines)


def _passed(ahead: float, behind: float) -> str:
    """A queue's tokens the request overtakes (less urgent), when there are any."""
    return f" ({ahead:g} tokens ahead, {behind:g} less urgent passed)" if behind else ""


class DecisionLog:
    """The last `size` decisions, in order, and by request id."""

    def __init__(self, size: int = 1024):
        self._recent: deque[RouteDecision] = deque(maxlen=size)
        self._by_id: OrderedDict[str, RouteDecision] = OrderedDict()
        self.size = size

    def append(self, d: RouteDecision) -> None:
        self._recent.append(d)
        self._by_id[d.request_id] = d
        self._by_id.move_to_end(d.request_id)
        while len(self._by_id) > self.size:
            self._by_id.popitem(last=False)

    def recent(self, n: int = 20) -> list[RouteDecision]:
        return list(self._recent)[-n:] if n > 0 else []

    def get(self, request_id: str) -> RouteDecision | None:
        return self._by_id.get(request_id)

    def __len__(self) -> int:
        return len(self._recent)
