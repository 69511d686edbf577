"""DutySwitch: a prefill duty and a decode duty on one engine, and which of them new work reaches.

    set_duty(duty): PREFILL / DECODE / draining between them (protocol/duty.py draws the lifecycle)

The engine thread ticks both duties and hands both every step's outputs; each takes only the
outputs of requests it holds, so a prompt being prefilled for another node and a sequence being
decoded here share steps as the engine schedules them (the decode duty's per-step prompt budget
applies to both). Which duty new work reaches is the Conductor's choice: it routes by the duty this
node reports in its LoadReports. A drain ends on the engine thread the tick the old duty holds no
request; until then the node reports TO_DECODE / TO_PREFILL and is routed nothing. Both duties keep
serving whatever reaches them in any duty, so a request routed just before a change is never refused
for it.
"""
from __future__ import annotations

import logging
from typing import Any

from raypd.decode_node.decode_duty import DecodeDuty
from raypd.engine.outputs import StepOutput
from raypd.node.node_duty import DutyLoad
from raypd.prefill_node.prefill_duty import PrefillDuty
from raypd.protocol.duty import Duty

log = logging.getLogger(__name__)


class DutySwitch:
    """Both duties as one NodeDuty (node/node_duty.py), in the duty the planner last ordered."""

    def __init__(self, name: str, prefill: PrefillDuty, decode: DecodeDuty, duty: Duty):
        self.name, self.prefill, self.decode = name, prefill, decode
        self.duty = duty
        self.duty_order = 0.0       # the Conductor's stamp of the order it last took, echoed in reports
        self.num_duty_changes = 0

    def set_duty(self, duty: Duty, order: float = 0.0) -> str:
        """Engine thread: take `duty` once the other duty's work has ended; the state it led to."""
        before, self.duty = self.duty, self.duty.toward(duty)
        self.duty_order = order
        if self.duty is not before:
            log.info("flex node %s: duty %s -> %s", self.name, before, self.duty)
        self._settle()
        return self.duty.value

    def _settle(self) -> None:
        """End a drain once the old duty holds no request."""
        old = self.duty.draining
        if old is not None and not self._of(old).requests:
            log.info("flex node %s: drained its %s work; now %s", self.name, old, self.duty.target)
            self.duty = self.duty.target
            self.num_duty_changes += 1

    def _of(self, duty: Duty) -> PrefillDuty | DecodeDuty:
        return self.prefill if duty is Duty.PREFILL else self.decode

    # -- NodeDuty ------------------------------------------------------------------------------------
    def tick(self) -> bool:
        busy = self.prefill.tick()
        busy = self.decode.tick() or busy
        if not self.duty.settled:
            self._settle()
        return busy

    def on_outputs(self, outputs: list[StepOutput]) -> None:
        self.prefill.on_outputs(outputs)
        self.decode.on_outputs(outputs)
        if not self.duty.settled:
            self._settle()

    def abort(self, request_id: str, reason: str) -> bool:
        """Abort the request in whichever duty holds it (a no-op in the other)."""
        held_for_prefill = self.prefill.abort(request_id, reason)
        return self.decode.abort(request_id, reason) or held_for_prefill

    def load(self) -> DutyLoad:
        both = self.prefill.load() + self.decode.load()
        return DutyLoad(both.waiting, both.queued_tokens, both.inflight, self.duty.value, self.duty_order,
                        both.queued_by_priority)

    def role_stats(self) -> dict[str, Any]:
        """Each duty's stats under its name; at the top, the totals NodeMetrics counts (completed and
        failed are prefills, as on a prefill node; finished sequences are in the engine's stats)."""
        p, d = self.prefill.role_stats(), self.decode.role_stats()
        queues = {**p["queues"], **d["queues"], "aborting": p["queues"]["aborting"] + d["queues"]["aborting"]}
        return {"duty": self.duty.value, "duty_changes": self.num_duty_changes, "prefill": p, "decode": d,
                "queues": queues,
                "completed": p["completed"], "failed": p["failed"], "prefix_copies": p["prefix_copies"],
                "refused": p["refused"] + d["refused"], "local_prefills": d["local_prefills"],
                "transfer": {"live_rooms": p["transfer"]["live_rooms"] + d["transfer"]["live_rooms"],
                             "transports": p["transfer"]["transports"]}}   # the prefill duty's sender writes

    def still_held(self) -> dict[str, int]:
        p, d = self.prefill.still_held(), self.decode.still_held()
        return {k: p.get(k, 0) + d.get(k, 0) for k in p.keys() | d.keys()}

    def ready_info(self) -> dict[str, Any]:
        return {**self.prefill.ready_info(), "duty": self.duty.value}

    def close(self) -> None:
        self.prefill.close()
        self.decode.close()
