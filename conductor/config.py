"""Frozen configuration of the Conductor. Derive a variant with dataclasses.replace, never mutate.

Defaults describe the engine's default model on this project's CPU engine (SmolLM2-135M, float32,
block_size 16); the simulator's GPU profile derives its own values (conductor/sim/profiles.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from raypd.protocol.kv_events import KVTier


@dataclass(frozen=True, slots=True)
class CostConfig:
    """Inputs of the Mooncake-style TTFT estimate (policies/cost.py)."""
    # 30 layers x 3 KV heads x 64 dims x (K, V) x 4 bytes: the engine's default model in float32.
    kv_bytes_per_token: int = 46_080
    # Used until a node reports its measured speed (LoadReport.prefill_tokens_per_s).
    default_prefill_tokens_per_s: float = 2000.0
    # Prefill cost grows with context (attention): time = n_new / speed * (1 + coeff * mean context).
    # SmolLM2-135M: 4 * hidden * layers attention FLOPs per context token over 2 * 106M linear FLOPs
    # per token ~ 3.3e-4. estimates.PrefillTimeModel refits it from observed prefill times.
    attention_coeff: float = 3.3e-4
    prefill_overhead_s: float = 0.005
    # Branch B of Mooncake's Algorithm 1: pull a longer prefix from another node before prefill.
    allow_fetch: bool = True
    fetch_overhead_s: float = 0.002
    # A node's KV tiers below its pool (protocol/kv_events.KVTier): a prompt's blocks held there are
    # loaded back (tokens x KV bytes per token / the tier's load rate) when that beats computing them.
    # The rates are each node's measured ones (LoadReport.tier_load_bytes_per_s); these defaults stand
    # in until it has measured one, and are set low on purpose (a pinned host copy runs at tens of
    # GB/s, a local NVMe read at several): an unmeasured tier should win only where it clearly does.
    use_tiers: bool = True          # False: price tier hits as misses (the pool-only model, to compare)
    host_load_bytes_per_s: float = 8e9
    disk_load_bytes_per_s: float = 1e9
    # Only the k best prefill candidates are paired with a decode node (pairing costs a vector op).
    top_k_prefill: int = 4
    # Decode node score = KV send time + decode_weight * estimated time per output token: a TBT
    # increase is paid on every token, the send only once.
    decode_weight: float = 10.0
    # Decode step time = a + b * batch, refitted from decode nodes' reports (estimates.DecodeStepModel).
    # Calibrated on the CPU engine: ~40 ms at batch 8, ~110 ms at batch 32.
    decode_step_base_s: float = 0.0167
    decode_step_per_seq_s: float = 0.00292

    def __post_init__(self) -> None:
        if self.host_load_bytes_per_s <= 0 or self.disk_load_bytes_per_s <= 0:
            raise ValueError("tier load rates must be > 0")

    def default_load_bytes_per_s(self, tier: KVTier) -> float:
        """The load rate assumed for a tier whose rate a node has not reported (inf: the pool)."""
        if tier == KVTier.POOL:
            return float("inf")
        return self.host_load_bytes_per_s if tier == KVTier.HOST else self.disk_load_bytes_per_s


@dataclass(frozen=True, slots=True)
class CacheAwareConfig:
    """The seed's threshold chain (policies/cache_aware.py)."""
    min_hit_ratio: float = 0.3      # below this best-match ratio the cache is ignored
    band: float = 0.9               # holders within this fraction of the best match count as holders
    balance_abs_tokens: int = 8192  # a holder is overloaded when its queue exceeds the lightest
    balance_rel: float = 1.5        # candidate's by both this many tokens and this factor (SGLang)
    distance_weight: float = 0.7    # near-cache score: weights of normalized distance and load
    load_weight: float = 0.3


@dataclass(frozen=True, slots=True)
class MigrationConfig:
    """When a hot prefix is replicated to a lightly loaded prefill node (migration.py)."""
    enabled: bool = False
    half_life_s: float = 30.0       # decay of the hit-frequency score
    hot_score: float = 4.0          # decayed hits before a prefix counts as hot
    min_prefix_tokens: int = 256
    overload_queue_s: float = 1.0   # holders overloaded now: every holder's queue exceeds this, or
    max_holder_utilization: float = 0.8  # soon: the prefix's hit rate x service time per holder exceeds this
    light_queue_s: float = 0.25     # the target's estimated queue must be below this
    window_s: float = 30.0          # horizon over which the saving is counted
    margin: float = 2.0             # saving must exceed margin x transfer cost
    max_concurrent: int = 2
    cooldown_s: float = 10.0        # per prefix, after a migration ends
    timeout_s: float = 60.0
    max_tracked: int = 4096         # prefixes whose scores are kept


@dataclass(frozen=True, slots=True)
class LocalPrefillConfig:
    """Split or local per request (split_or_local.py): a decode node may prefill a prompt itself."""
    enabled: bool = False
    # Prompt tokens a decode node computes per step after its decodes; the nodes' engines must use
    # the same (EngineConfig.max_prefill_tokens_per_step; `raypd serve --adaptive` sets both).
    step_budget_tokens: int = 32
    # Seconds of stall a local prompt puts on a decode node's running requests, summed over them,
    # counted against one second of this request's TTFT (split_or_local.py): 1 is the least total
    # wait; higher protects the running requests' token streams more, lower favours new requests.
    tpot_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.step_budget_tokens < 1:
            raise ValueError(f"step_budget_tokens must be >= 1, got {self.step_budget_tokens}")
        if self.tpot_weight < 0:
            raise ValueError(f"tpot_weight must be >= 0, got {self.tpot_weight}")


# The share of a TPOT target at which decode steps call for another decode node
# (DutyPlannerConfig.decode_busy_step_s): moved before the target breaks, since a node's move takes a
# drain (its old duty's work) and a cooldown.
TPOT_TARGET_SHARE = 0.8


@dataclass(frozen=True, slots=True)
class DutyPlannerConfig:
    """Flex nodes' duty planner (planners/duties.py says what each field does to it)."""
    enabled: bool = True          # acts only on flex nodes: a deployment without them never sees it
    busy_wait_s: float = 2.0      # prompt wait above which one more node takes up prefill
    hold_s: float = 4.0           # how long a pressure must last before a node moves
    cooldown_s: float = 8.0       # after an order, before the next one
    min_prefill_nodes: int = 1    # 0 lets every node decode (only with local prefill: ConductorCore checks)
    min_decode_nodes: int = 1
    max_backoff: float = 8.0      # cooldown_s x this at most, after orders that flap back and forth
    # A node leaves a side only if that side's pressure then stays under this: decode work outlives
    # the moment (a sequence holds its KV for its whole answer), so the side left keeps headroom.
    leave_below: float = 0.5
    decode_min_free_share: float = 0.1   # decode nodes with less of their KV pools free (on average) call for help
    # Decode steps slower than this call for another decode node too (a fraction of the TPOT
    # target; None: only KV memory does; 0: any decode work does). Device-dependent, so no default.
    decode_busy_step_s: float | None = None

    def __post_init__(self) -> None:
        if self.busy_wait_s <= 0:
            raise ValueError(f"need busy_wait_s > 0, got {self.busy_wait_s}")
        if self.hold_s < 0 or self.cooldown_s < 0:
            raise ValueError("hold_s and cooldown_s must be >= 0")
        if self.min_prefill_nodes < 0 or self.min_decode_nodes < 1:
            raise ValueError("need min_prefill_nodes >= 0 and min_decode_nodes >= 1")
        if not 0 < self.leave_below <= 1:
            raise ValueError(f"need 0 < leave_below <= 1, got {self.leave_below}")
        if self.max_backoff < 1:
            raise ValueError(f"need max_backoff >= 1, got {self.max_backoff}")
        if not 0 <= self.decode_min_free_share < 1:
            raise ValueError(f"need 0 <= decode_min_free_share < 1, got {self.decode_min_free_share}")
        if self.decode_busy_step_s is not None and self.decode_busy_step_s < 0:
            raise ValueError(f"need decode_busy_step_s >= 0, got {self.decode_busy_step_s}")


@dataclass(frozen=True, slots=True)
class ConductorConfig:
    policy: str = "cost"
    block_size: int = 16            # until nodes' events say otherwise
    heartbeat_timeout_s: float = 10.0
    tick_interval_s: float = 0.5
    decision_log_size: int = 1024
    ttft_slo_s: float | None = None  # set to reject requests whose best TTFT estimate breaks it
    tbt_slo_s: float | None = None
    verify_hashes: bool = True      # recompute every BlockStored hash with engine.block_hash
    resync_timeout_s: float = 30.0
    duty_order_timeout_s: float = 10.0   # telling a flex node its new duty (it answers from its engine thread)
    # Count a routed prompt's blocks as held by its prefill node until its KV events report them
    # (pending_prefixes.py), for at most pending_ttl_factor x the decision's TTFT estimate (>= 1 s).
    pending_prefixes: bool = True
    pending_ttl_factor: float = 2.0
    cost: CostConfig = field(default_factory=CostConfig)
    cache_aware: CacheAwareConfig = field(default_factory=CacheAwareConfig)
    migration: MigrationConfig = field(default_factory=MigrationConfig)
    local_prefill: LocalPrefillConfig = field(default_factory=LocalPrefillConfig)
    duties: DutyPlannerConfig = field(default_factory=DutyPlannerConfig)   # flex nodes' duty planner

    def __post_init__(self) -> None:
        if self.duties.min_prefill_nodes == 0 and not self.local_prefill.enabled:
            raise ValueError("duties.min_prefill_nodes=0 needs local_prefill.enabled: with no prefill node "
                             "and no local path, no request could be prefilled")
