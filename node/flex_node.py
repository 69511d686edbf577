"""FlexNode: a prefill node and a decode node on one engine; the Conductor's planner picks its duty.

    prefill(req) ─> the PrefillNode half (bootstrap ─> waiting ─> inflight: prefill_node/prefill_node.py)
    generate(req) ─> the DecodeNode half (prealloc ─> transfer ─> running, or the local path:
                     decode_node/decode_node.py)
    set_duty(duty): PREFILL / DECODE / draining between them (protocol/duty.py draws the lifecycle)

Both halves are the role classes themselves, built on this node's one NodeCore: one engine, one KV
pool, one set of token streams; each half keeps its own stages, transfer endpoints and aux slots.
The engine thread ticks both halves and hands both every step's outputs; each half takes only the
outputs of requests it holds, so a prompt being prefilled for another node and a sequence being
decoded here share steps as the engine schedules them (the decode half's per-step prompt budget
applies to both).

Which half new work reaches is the Conductor's choice: it routes by the duty this node reports in its
LoadReports. A drain ends on the engine thread the tick the old half holds no request; until then
the node reports TO_DECODE / TO_PREFILL and is routed nothing. Both halves keep serving whatever
reaches them in any duty, so a request routed just before a change is never refused for it.
"""
from __future__ import annotations

import logging
from typing import Any

from raypd.decode_node.decode_node import DecodeNode
from raypd.engine.outputs import StepOutput
from raypd.kvtransfer.data_plane_auth import DataPlaneSecret
from raypd.node.node_core import NodeCore
from raypd.prefill_node.prefill_node import PrefillNode
from raypd.protocol.duty import Duty
from raypd.protocol.messages import KVEventBatch, LoadReport, NodeRequest, PrefillResult, StreamEnd
from raypd.protocol.roles import Role

log = logging.getLogger(__name__)


class FlexNode:
    role = Role.FLEX

    def __init__(self, name: str, model: str | None = None, engine_options: dict | None = None,
                 num_cpus: float = 1.0, transfer_options: dict | None = None, aux_slots: int = 256,
                 prealloc_timeout_s: float | None = None, data_plane_secret: DataPlaneSecret | None = None,
                 duty: Duty | str = Duty.DECODE):
        self.name = name
        self.duty = Duty.parse(duty).target
        self.duty_order = 0.0       # the Conductor's stamp of the order it last took, echoed in reports
        self.num_duty_changes = 0
        self.core = core = NodeCore(name, self.role, model, engine_options, num_cpus, tick=self._tick,
                                    on_outputs=self._on_outputs, data_plane_secret=data_plane_secret)
        self.host = core.host
        self.prefill_half = PrefillNode(name, transfer_options=transfer_options, aux_slots=aux_slots, core=core)
        self.decode_half = DecodeNode(name, transfer_options=transfer_options, aux_slots=aux_slots,
                                      prealloc_timeout_s=prealloc_timeout_s, core=core,
                                      receiver_name=f"{name}-decode")
        core.start()

    # -- Ray-callable: the two halves ---------------------------------------------------------------
    async def prefill(self, req: NodeRequest) -> PrefillResult:
        return await self.prefill_half.prefill(req)

    async def generate(self, req: NodeRequest) -> StreamEnd:
        return await self.decode_half.generate(req)

    async def abort(self, request_id: str, reason: str = "aborted by the client") -> None:
        """Abort the request in whichever half holds it (a no-op in the other)."""
        await self.core.call(self._abort, request_id, reason)

    async def export_prefix(self, token_ids: list[int], room: int, target_node: str = "") -> PrefillResult:
        return await self.prefill_half.export_prefix(token_ids, room, target_node)

    async def import_prefix(self, token_ids: list[int], room: int, source_bootstrap_address: str) -> PrefillResult:
        return await self.prefill_half.import_prefix(token_ids, room, source_bootstrap_address)

    async def abort_migration(self, room: int) -> None:
        await self.prefill_half.abort_migration(room)

    async def set_duty(self, duty: str, order: float = 0.0) -> str:
        """The planner's order: take `duty` once the other duty's work has ended. Returns the duty
        state it led to (already settled when nothing was held). `order`: the Conductor's stamp of
        the order, echoed in every later LoadReport, so the Conductor can tell a report written
        before the node took the order from one written after (no comparison across clocks)."""
        return await self.core.call(self._set_duty, Duty.parse(duty), order)

    # -- Ray-callable, every role ---------------------------------------------------------------------
    async def ready(self) -> dict:
        return self.core.info(bootstrap_address=self.prefill_half.sender.bootstrap_address, duty=self.duty.value)

    async def load_report(self) -> LoadReport:
        return await self.core.call(self._load_report)

    async def stats(self) -> dict:
        return await self.core.call(self._stats)

    async def drain_kv_events(self) -> KVEventBatch:
        return await self.core.call(self.core.drain_kv_events)

    async def kv_snapshot(self) -> tuple[int, list]:
        return await self.core.call(self.core.kv_snapshot)

    async def check_idle(self) -> dict:
        return await self.core.call(self._check_idle)

    async def attach_conductor(self, conductor) -> None:
        await self.core.attach_conductor(conductor, self)

    async def crash_engine(self) -> None:
        """Chaos testing: crash this node's engine thread (node/node_core.py says what follows)."""
        self.core.crash_engine()

    async def fail_requests(self, n: int) -> int:
        """Chaos testing: fail the next n streamed requests at once (NodeCore.fail_requests)."""
        return await self.core.fail_requests(n)

    async def shutdown(self) -> None:
        self.core.shutdown()
        self.prefill_half.sender.close()
        self.prefill_half.receiver.close()
        self.decode_half.receiver.close()

    # -- engine thread ----------------------------------------------------------------------------------
    def _half(self, duty: Duty) -> PrefillNode | DecodeNode:
        return self.prefill_half if duty is Duty.PREFILL else self.decode_half

    def _set_duty(self, duty: Duty, order: float = 0.0) -> str:
        before, self.duty = self.duty, self.duty.toward(duty)
        self.duty_order = order
        if self.duty is not before:
            log.info("flex node %s: duty %s -> %s", self.name, before, self.duty)
        self._settle()
        return self.duty.value

    def _settle(self) -> None:
        """End a drain once the old half holds no request."""
        old = self.duty.draining
        if old is not None and not self._half(old).requests:
            log.info("flex node %s: drained its %s work; now %s", self.name, old, self.duty.target)
            self.duty = self.duty.target
            self.num_duty_changes += 1

    def _abort(self, request_id: str, reason: str) -> None:
        self.prefill_half._abort(request_id, reason)
        self.decode_half._abort(request_id)

    def _tick(self) -> bool:
        busy = self.prefill_half._tick()
        busy = self.decode_half._tick() or busy
        if not self.duty.settled:
            self._settle()
        return busy

    def _on_outputs(self, outputs: list[StepOutput]) -> None:
        self.prefill_half._on_outputs(outputs)
        self.decode_half._on_outputs(outputs)
        if not self.duty.settled:
            self._settle()

    # -- load and introspection ---------------------------------------------------------------------------
    def _load_report(self) -> LoadReport:
        p, d = self.prefill_half._held(), self.decode_half._held()
        return self.core.load_report(p["waiting"] + d["waiting"], p["queued_tokens"] + d["queued_tokens"],
                                     p["inflight"] + d["inflight"], stats=self._role_stats(), duty=self.duty.value,
                                     duty_order=self.duty_order)

    def _stats(self) -> dict:
        return self.core.stats(**self._role_stats())

    def _role_stats(self) -> dict[str, Any]:
        """Each half's stats under its duty's name; at the top, the totals NodeMetrics counts (completed and
        failed are prefills, as on a prefill node; finished sequences are in the engine's stats)."""
        p, d = self.prefill_half._role_stats(), self.decode_half._role_stats()
        queues = {**p["queues"], **d["queues"], "aborting": p["queues"]["aborting"] + d["queues"]["aborting"]}
        return {"duty": self.duty.value, "duty_changes": self.num_duty_changes, "prefill": p, "decode": d,
                "queues": queues,
                "completed": p["completed"], "failed": p["failed"], "prefix_copies": p["prefix_copies"],
                "refused": p["refused"] + d["refused"], "local_prefills": d["local_prefills"],
                "transfer": {"live_rooms": p["transfer"]["live_rooms"] + d["transfer"]["live_rooms"]}}

    def _check_idle(self) -> dict:
        p, d = self.prefill_half._still_held(), self.decode_half._still_held()
        return self.core.check_idle(**{k: p.get(k, 0) + d.get(k, 0) for k in p.keys() | d.keys()})
