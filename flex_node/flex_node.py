"""FlexNode: the Ray actor holding a prefill duty and a decode duty on one engine (duty_switch.py);
the Conductor's planner picks which one new work reaches.

    prefill(req) ─> the prefill duty (bootstrap ─> waiting ─> inflight: prefill_node/prefill_duty.py)
    generate(req) ─> the decode duty (prealloc ─> transfer ─> running, or the local path:
                     decode_node/decode_duty.py)
    set_duty(duty): PREFILL / DECODE / draining between them (protocol/duty.py draws the lifecycle)

Each duty keeps its own stages, transfer endpoints and aux slots; the engine, the KV pool and the
token streams are the node's one NodeCore. Its calls beyond every node's (node/node_actor.py) are
both roles' calls and set_duty.
"""
from __future__ import annotations

from raypd.decode_node.decode_duty import DecodeDuty
from raypd.flex_node.duty_switch import DutySwitch
from raypd.kvtransfer.identity import DataPlaneIdentity
from raypd.node.node_actor import NodeActor
from raypd.node.node_core import NodeCore
from raypd.prefill_node.prefill_duty import PrefillDuty
from raypd.protocol.duty import Duty
from raypd.protocol.messages import NodeRequest, PrefillResult, StreamEnd
from raypd.protocol.roles import Role


class FlexNode(NodeActor):
    role = Role.FLEX
    duty: DutySwitch

    def __init__(self, name: str, model: str | None = None, engine_options: dict | None = None,
                 num_cpus: float = 1.0, transfer_options: dict | None = None, aux_slots: int = 256,
                 prealloc_timeout_s: float | None = None, data_plane_identity: DataPlaneIdentity | None = None,
                 duty: Duty | str = Duty.DECODE, chaos_hooks: bool = False):
        core = NodeCore(name, self.role, model, engine_options, num_cpus, data_plane_identity, chaos_hooks)
        prefill = PrefillDuty(core, name, transfer_options, aux_slots)
        decode = DecodeDuty(core, name, transfer_options, aux_slots, prealloc_timeout_s,
                            receiver_name=f"{name}-decode")
        super().__init__(core, DutySwitch(name, prefill, decode, Duty.parse(duty).target))

    async def prefill(self, req: NodeRequest) -> PrefillResult:
        return await self.duty.prefill.prefill(req)

    async def generate(self, req: NodeRequest) -> StreamEnd:
        return await self.duty.decode.generate(req)

    async def export_prefix(self, token_ids: list[int], room: int, target_node: str = "") -> PrefillResult:
        return await self.duty.prefill.export_prefix(token_ids, room, target_node)

    async def import_prefix(self, token_ids: list[int], room: int, source_bootstrap_address: str) -> PrefillResult:
        return await self.duty.prefill.import_prefix(token_ids, room, source_bootstrap_address)

    async def abort_migration(self, room: int) -> None:
        await self.duty.prefill.abort_migration(room)

    async def set_duty(self, duty: str, order: float = 0.0) -> str:
        """The planner's order: take `duty` once the other duty's work has ended. Returns the duty
        state it led to (already settled when nothing was held). `order`: the Conductor's stamp of
        the order, echoed in every later LoadReport, so the Conductor can tell a report written
        before the node took the order from one written after (no comparison across clocks)."""
        return await self.core.call(self.duty.set_duty, Duty.parse(duty), order)
