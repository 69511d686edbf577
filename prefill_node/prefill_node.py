"""PrefillNode: the Ray actor serving the prefill duty (prefill_duty.py draws its lifecycle) on an
engine of its own. Its calls beyond every node's (node/node_actor.py): prefill, and the prefix
copies the Conductor orders (prefix_copy.py)."""
from __future__ import annotations

from raypd.kvtransfer.identity import DataPlaneIdentity
from raypd.node.node_actor import NodeActor
from raypd.node.node_core import NodeCore
from raypd.prefill_node.prefill_duty import PrefillDuty
from raypd.protocol.messages import NodeRequest, PrefillResult
from raypd.protocol.roles import Role


class PrefillNode(NodeActor):
    role = Role.PREFILL
    duty: PrefillDuty

    def __init__(self, name: str, model: str | None = None, engine_options: dict | None = None,
                 num_cpus: float = 1.0, transfer_options: dict | None = None, aux_slots: int = 256,
                 data_plane_identity: DataPlaneIdentity | None = None, max_early_prefills: int = 8, chaos_hooks: bool = False):
        core = NodeCore(name, self.role, model, engine_options, num_cpus, data_plane_identity, chaos_hooks)
        super().__init__(core, PrefillDuty(core, name, transfer_options, aux_slots, max_early_prefills))

    async def prefill(self, req: NodeRequest) -> PrefillResult:
        """Serve the request's prefill and KV transfer; returns when its room has ended, either way."""
        return await self.duty.prefill(req)

    async def export_prefix(self, token_ids: list[int], room: int, target_node: str = "") -> PrefillResult:
        return await self.duty.export_prefix(token_ids, room, target_node)

    async def import_prefix(self, token_ids: list[int], room: int, source_bootstrap_address: str) -> PrefillResult:
        return await self.duty.import_prefix(token_ids, room, source_bootstrap_address)

    async def abort_migration(self, room: int) -> None:
        await self.duty.abort_migration(room)
