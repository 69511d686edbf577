"""DecodeNode: the Ray actor serving the decode duty (decode_duty.py draws its lifecycle) on an
engine of its own. Its call beyond every node's (node/node_actor.py): generate."""
from __future__ import annotations

from raypd.decode_node.decode_duty import DecodeDuty
from raypd.kvtransfer.identity import DataPlaneIdentity
from raypd.node.node_actor import NodeActor
from raypd.node.node_core import NodeCore
from raypd.protocol.messages import NodeRequest, StreamEnd
from raypd.protocol.roles import Role


class DecodeNode(NodeActor):
    role = Role.DECODE
    duty: DecodeDuty

    def __init__(self, name: str, model: str | None = None, engine_options: dict | None = None,
                 num_cpus: float = 1.0, transfer_options: dict | None = None, aux_slots: int = 256,
                 prealloc_timeout_s: float | None = None, data_plane_identity: DataPlaneIdentity | None = None, chaos_hooks: bool = False):
        core = NodeCore(name, self.role, model, engine_options, num_cpus, data_plane_identity, chaos_hooks)
        super().__init__(core, DecodeDuty(core, name, transfer_options, aux_slots, prealloc_timeout_s))

    async def generate(self, req: NodeRequest) -> StreamEnd:
        """Decode a request whose prefill runs on the node at req.bootstrap_address (or here, when
        req.local_prefill), streaming its tokens to req.reply_address; return once it ended."""
        return await self.duty.generate(req)
