"""How many GPUs each node actor asks Ray for.

One at most: raypd has no tensor parallelism, so a node actor runs its engine on one GPU, and a
second GPU would sit reserved and idle. Fractions are allowed (Ray shares a GPU between actors that
each ask for part of it), for models small enough that several engines fit on one device; give
each of them a matching --gpu-memory-utilization. Unset: one GPU per node where the Ray cluster
has GPUs, none where it has none, so `raypd serve` on a GPU machine uses its GPUs without a flag.
"""
from __future__ import annotations

MAX_GPUS_PER_NODE = 1.0


class GpuBudgetError(ValueError):
    """--gpus-per-node is outside what a node actor can use; the message is what a user sees."""


def check_gpus_per_node(requested: float | None) -> None:
    if requested is None:
        return
    if requested < 0:
        raise GpuBudgetError(f"--gpus-per-node must be >= 0, got {requested}")
    if requested > MAX_GPUS_PER_NODE:
        raise GpuBudgetError(
            f"--gpus-per-node {requested}: a node actor uses one GPU (raypd has no tensor parallelism yet), "
            "so more would be reserved and idle; run more nodes (--prefill-nodes/--decode-nodes) instead")


def gpus_per_node(requested: float | None, cluster_gpus: float) -> float:
    """The GPUs each node actor asks for: `requested` when set, else 1 if the cluster has any GPU."""
    check_gpus_per_node(requested)
    if requested is not None:
        return requested
    return MAX_GPUS_PER_NODE if cluster_gpus > 0 else 0.0


def cluster_gpus() -> float:
    """The GPUs the connected Ray cluster reports (0 when Ray is not initialized here)."""
    import ray
    return float(ray.cluster_resources().get("GPU", 0)) if ray.is_initialized() else 0.0
