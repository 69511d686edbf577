"""A node actor's device, from the GPU Ray assigned it.

Why not just "cuda": since Ray 2.60 an actor that asked for no GPU is no longer hidden from the
machine's GPUs (CUDA_VISIBLE_DEVICES is left alone), so every such actor would see every GPU and put
its engine on GPU 0, all of them on one device. An actor that asked for a GPU gets it in
`ray.get_gpu_ids()` and, unless the override is off, a CUDA_VISIBLE_DEVICES naming only that one.
So: a node with an assigned GPU runs on exactly that GPU; a node that sees CUDA but was assigned
none is an error (the user forgot --gpus-per-node, or asked for --device cuda without it), not a
silent pile-up on GPU 0; a node on a machine without CUDA runs on the CPU.

One GPU per node actor: there is no tensor parallelism, so an actor that got several GPUs would
use one and waste the rest; that is refused here, and earlier by cluster/launch/gpu_budget.py.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from raypd.engine.errors import ConfigError

log = logging.getLogger(__name__)


class GpuAssignmentError(ConfigError):
    """The node's requested device and the GPUs Ray gave it do not fit together."""


@dataclass(frozen=True, slots=True)
class GpuAssignment:
    """What Ray gave this actor and what this process can see."""
    gpu_ids: tuple[str, ...]        # ray.get_gpu_ids(), as strings (ids or UUIDs)
    cuda_visible: str | None        # CUDA_VISIBLE_DEVICES as this process sees it
    cuda_available: bool            # torch.cuda.is_available()

    @classmethod
    def of_this_actor(cls) -> GpuAssignment | None:
        """None outside a Ray actor (one-process use: the engine resolves "auto" itself)."""
        try:
            import ray
        except ImportError:
            return None
        if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
            return None
        import torch
        return cls(tuple(str(g) for g in ray.get_gpu_ids()), os.environ.get("CUDA_VISIBLE_DEVICES"),
                   torch.cuda.is_available())

    def device(self, requested: str) -> str:
        """The engine's device option for a node that asked for `requested` ("auto", "cpu", "cuda",
        "cuda:N")."""
        if len(self.gpu_ids) > 1:
            raise GpuAssignmentError(
                f"Ray assigned this node {len(self.gpu_ids)} GPUs ({', '.join(self.gpu_ids)}); a node uses one "
                "(no tensor parallelism): use --gpus-per-node 1 and more nodes")
        wants_cuda = requested.startswith("cuda")
        if not self.gpu_ids:
            if wants_cuda or (requested == "auto" and self.cuda_available):
                raise GpuAssignmentError(
                    "CUDA is visible to this node but Ray assigned it no GPU, so it would share GPU 0 with "
                    "every other node: start the nodes with --gpus-per-node 1 (the default where Ray "
                    "reports GPUs), or --device cpu to run them on the CPU")
            return requested if requested != "auto" else "cpu"
        if requested == "cpu":
            log.warning("Ray assigned GPU %s to this node but --device cpu keeps it on the CPU", self.gpu_ids[0])
            return "cpu"
        return f"cuda:{self.local_index(self.gpu_ids[0])}"

    def local_index(self, gpu_id: str) -> int:
        """The CUDA index of a Ray GPU id in this process: its place in CUDA_VISIBLE_DEVICES when
        Ray (or the user) set it, else the id itself."""
        if self.cuda_visible:
            visible = [v.strip() for v in self.cuda_visible.split(",")]
            if gpu_id in visible:
                return visible.index(gpu_id)
            raise GpuAssignmentError(f"Ray assigned GPU {gpu_id} but CUDA_VISIBLE_DEVICES={self.cuda_visible} "
                                     "hides it from this process")
        try:
            return int(gpu_id)
        except ValueError:
            raise GpuAssignmentError(f"Ray assigned GPU {gpu_id!r}, which is not an index, and "
                                     "CUDA_VISIBLE_DEVICES is unset") from None


def node_device(requested: str, assignment: GpuAssignment | None, node: str) -> str:
    """The device option a node's engine gets, logged once: from Ray's assignment in an actor,
    `requested` unchanged elsewhere."""
    if assignment is None:
        return requested
    device = assignment.device(requested)
    log.info("%s: Ray assigned GPU ids %s (CUDA_VISIBLE_DEVICES=%s) -> device %s", node,
             list(assignment.gpu_ids) or "none", assignment.cuda_visible, device)
    return device

