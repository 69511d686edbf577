"""Hardware profiles: step-time cost models for the simulated nodes and the topology they sit in.

cpu (calibrated on this project's engine): SmolLM2-135M in float32 on a 2-core VM - prefill about
  2000 tokens/s for long prompts (1500-2500 measured), decode steps ~40 ms at batch 8 and ~110 ms at
  batch 32 (docs/benchmarks.md, engine runs of 2026-11-22), so step = 16.7 ms + 2.92 ms x batch;
  KV 46,080 bytes per token (30 layers x 3 KV heads x 64 x 2 x 4 B); 1 GiB of KV per node
  (the engine's default kv_cache_memory_mb) ~ 23k tokens; nodes on 25 Gb/s (3.1 GB/s) NICs.
gpu (an 8B Llama-3-class model in bf16 on one H100 SXM per node; derived, not measured here):
  prefill 12k tokens/s at short context: 16 GFLOP per token against 989 dense bf16 TFLOPS at ~20%
  end-to-end utilization; attention adds 4 x 4096 x 32 = 0.5 MFLOP per context token, k = 3.3e-5;
  decode step = 7 ms (weights 16 GB at 3.35 TB/s plus launch overheads, the ~140 tokens/s
  single-stream figure commonly reported for 8B on H100) + 0.05 ms per sequence + KV reads of
  128 KiB per context token at ~2.3 TB/s effective; KV 131,072 bytes per token (32 layers x 8 KV
  heads x 128 x 2 x 2 B); ~55 GB of HBM for KV ~ 420k tokens per node; one 400 Gb/s NIC per GPU
  (50 GB/s), NVLink4 (450 GB/s) between GPUs of one host, 8 GPUs per host.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from raypd.conductor.config import CacheAwareConfig, ConductorConfig, CostConfig, MigrationConfig
from raypd.conductor.topology import LinkSpec, Topology, TopologyDefaults


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    name: str
    prefill_tokens_per_s: float
    attention_coeff: float
    prefill_overhead_s: float
    decode_base_s: float
    decode_per_seq_s: float
    decode_per_ctx_token_s: float
    kv_bytes_per_token: int
    prefill_cache_tokens: int      # prefix cache capacity of one prefill node
    decode_kv_tokens: int          # KV capacity of one decode node
    max_decode_batch: int
    nodes_per_host: int
    hosts_per_tor: int
    nic: LinkSpec                  # one node's link to its ToR
    intra_host: LinkSpec
    tor_spine: LinkSpec
    ttft_slo_s: float              # default SLOs for goodput
    tpot_slo_s: float

    def prefill_time(self, n_new: int, n_cached: int) -> float:
        n_new = max(n_new, 1)
        return self.prefill_overhead_s + n_new / self.prefill_tokens_per_s * (
            1.0 + self.attention_coeff * (n_cached + 0.5 * n_new))

    def decode_step(self, batch: int, ctx_tokens: float) -> float:
        return self.decode_base_s + self.decode_per_seq_s * batch + self.decode_per_ctx_token_s * ctx_tokens

    def in_units_of(self, tokens: int) -> HardwareProfile:
        """The same hardware counted in units of `tokens` real tokens (one hashed sim token stands
        for `tokens` tokens): speeds divide, per-token costs and capacities scale."""
        if tokens == 1:
            return self
        return replace(self, name=f"{self.name}/x{tokens}", prefill_tokens_per_s=self.prefill_tokens_per_s / tokens,
                       attention_coeff=self.attention_coeff * tokens,
                       decode_per_ctx_token_s=self.decode_per_ctx_token_s * tokens,
                       kv_bytes_per_token=self.kv_bytes_per_token * tokens,
                       prefill_cache_tokens=self.prefill_cache_tokens // tokens,
                       decode_kv_tokens=self.decode_kv_tokens // tokens)


CPU = HardwareProfile(
    name="cpu", prefill_tokens_per_s=2000.0, attention_coeff=3.3e-4, prefill_overhead_s=0.005,
    decode_base_s=0.0167, decode_per_seq_s=0.00292, decode_per_ctx_token_s=0.0,
    kv_bytes_per_token=46_080, prefill_cache_tokens=23_000, decode_kv_tokens=23_000, max_decode_batch=64,
    nodes_per_host=1, hosts_per_tor=16, nic=LinkSpec(3.1, 5.0), intra_host=LinkSpec(6.0, 0.0),
    tor_spine=LinkSpec(12.5, 2.0), ttft_slo_s=2.0, tpot_slo_s=0.15)

GPU = HardwareProfile(
    name="gpu", prefill_tokens_per_s=12_000.0, attention_coeff=3.3e-5, prefill_overhead_s=0.003,
    decode_base_s=0.007, decode_per_seq_s=0.00005, decode_per_ctx_token_s=131_072 / 2.3e12,
    kv_bytes_per_token=131_072, prefill_cache_tokens=420_000, decode_kv_tokens=420_000, max_decode_batch=256,
    nodes_per_host=8, hosts_per_tor=4, nic=LinkSpec(50.0, 2.0), intra_host=LinkSpec(450.0, 1.0),
    tor_spine=LinkSpec(400.0, 1.0), ttft_slo_s=5.0, tpot_slo_s=0.05)

PROFILES = {"cpu": CPU, "gpu": GPU}


def conductor_config(profile: HardwareProfile, policy: str, *, migration: bool = False, block_size: int,
                     migration_overrides: dict | None = None, **overrides) -> ConductorConfig:
    """The Conductor's configuration for a profile. Its prior speeds are the profile's, but the
    policies run on what nodes report (speed, queues), as they would in a cluster."""
    cost = CostConfig(kv_bytes_per_token=profile.kv_bytes_per_token,
                      default_prefill_tokens_per_s=profile.prefill_tokens_per_s,
                      attention_coeff=profile.attention_coeff, prefill_overhead_s=profile.prefill_overhead_s,
                      decode_step_base_s=profile.decode_base_s, decode_step_per_seq_s=profile.decode_per_seq_s)
    mig = MigrationConfig(enabled=migration, overload_queue_s=profile.ttft_slo_s * 0.2,
                          light_queue_s=profile.ttft_slo_s * 0.05, min_prefix_tokens=4 * block_size,
                          max_concurrent=4, half_life_s=10.0, hot_score=4.0, window_s=10.0, timeout_s=30.0)
    mig = replace(mig, **(migration_overrides or {}))
    base = ConductorConfig(policy=policy, block_size=block_size, heartbeat_timeout_s=1e12, verify_hashes=False,
                           decision_log_size=64, cost=cost, migration=mig,
                           cache_aware=CacheAwareConfig(balance_abs_tokens=int(profile.prefill_tokens_per_s)))
    return replace(base, **overrides)


def build_topology(profile: HardwareProfile, num_nodes: int, spines: int = 2) -> tuple[Topology, list[str]]:
    """Hosts of `nodes_per_host` nodes, `hosts_per_tor` hosts per ToR, every ToR on every spine.
    Returns the topology and each node's host name; prefill and decode nodes are interleaved over
    hosts by the caller."""
    defaults = TopologyDefaults(host_tor=profile.nic, tor_spine=profile.tor_spine,
                                host_nvlink=profile.intra_host, same_host=profile.intra_host)
    topo = Topology(defaults)
    n_hosts = int(np.ceil(num_nodes / profile.nodes_per_host))
    n_tors = int(np.ceil(n_hosts / profile.hosts_per_tor))
    for s in range(spines):
        topo.add_switch(f"spine-{s}", "spine")
    for t in range(n_tors):
        topo.add_switch(f"tor-{t}", "tor")
        for s in range(spines):
            topo.add_link(f"tor-{t}", f"spine-{s}", profile.tor_spine.bandwidth, profile.tor_spine.latency_us)
    for h in range(n_hosts):
        topo.add_host(f"host-{h}", tor=f"tor-{h // profile.hosts_per_tor}", rebuild=False)
    topo.rebuild()
    hosts = [f"host-{i // profile.nodes_per_host}" for i in range(num_nodes)]
    return topo, hosts
