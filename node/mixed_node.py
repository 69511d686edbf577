"""MixedNode: the Ray actor serving the colocated duty (mixed_duty.py) on an engine of its own, the
baseline every PD measurement is compared with. Its call beyond every node's (node_actor.py): generate."""
from __future__ import annotations

from raypd.kvtransfer.identity import DataPlaneIdentity
from raypd.node.mixed_duty import MixedDuty
from raypd.node.node_actor import NodeActor
from raypd.node.node_core import NodeCore
from raypd.protocol.messages import NodeRequest, StreamEnd
from raypd.protocol.roles import Role


class MixedNode(NodeActor):
    role = Role.MIXED
    duty: MixedDuty

    def __init__(self, name: str, model: str | None = None, engine_options: dict | None = None,
                 num_cpus: float = 1.0, data_plane_identity: DataPlaneIdentity | None = None, chaos_hooks: bool = False):
        core = NodeCore(name, self.role, model, engine_options, num_cpus, data_plane_identity, chaos_hooks)
        super().__init__(core, MixedDuty(core, name))

    async def generate(self, req: NodeRequest) -> StreamEnd:
        """Stream the request's tokens to req.reply_address; return once it ended."""
        return await self.duty.generate(req)
