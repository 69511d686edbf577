"""NodeDuty: the work a node serves on its engine thread, apart from the actor that holds it.

A node actor (node/node_actor.py) is one NodeCore (engine, engine thread, token streams) and one
duty. The core's engine thread calls the duty's tick() and on_outputs(); the actor's Ray-callable
methods read its load(), role_stats() and still_held(). The duties:

    PrefillDuty   prefill_node/prefill_duty.py   bootstrap -> waiting -> inflight, KV sender
    DecodeDuty    decode_node/decode_duty.py     prealloc -> transfer -> running, KV receiver
    MixedDuty     node/mixed_node.py             the engine's own queues, no transfer
    DutySwitch    flex_node/duty_switch.py       one prefill and one decode duty on one engine

A duty is built on the core it serves (it needs the core's engine and streams) before the core
starts; nothing but the engine thread calls the methods below, except ready_info() and close().
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from raypd.engine.outputs import StepOutput
from raypd.protocol.queued_by_priority import QueuedByPriority, summarize


@dataclass(frozen=True, slots=True)
class DutyLoad:
    """What a duty holds outside the engine, added to the engine's load in the node's LoadReport."""
    waiting: int = 0          # requests not yet in the engine
    queued_tokens: int = 0    # their prompt tokens
    inflight: int = 0         # KV handoffs under way
    duty: str = ""            # a flex node's duty state (protocol/duty.py); "" for a fixed role
    duty_order: float = 0.0   # the Conductor's stamp of the duty order the node last took
    queued_by_priority: QueuedByPriority = ()   # queued_tokens by priority (protocol/queued_by_priority.py)

    def __add__(self, other: DutyLoad) -> DutyLoad:
        """Two duties' holdings together (a flex node's); the duty fields are set by the caller."""
        return DutyLoad(self.waiting + other.waiting, self.queued_tokens + other.queued_tokens,
                        self.inflight + other.inflight,
                        queued_by_priority=summarize([*self.queued_by_priority, *other.queued_by_priority]))


class NodeDuty(Protocol):
    def tick(self) -> bool:
        """Advance the stages; True while transfers need fast polling (engine thread). Raises
        EndpointBrokenError when one of the duty's transfer endpoints is broken: the engine thread
        then ends as in a crash, and the node restarts with new endpoints (node_core.py)."""
        ...

    def on_outputs(self, outputs: list[StepOutput]) -> None:
        """Deliver a step's outputs; a duty takes only those of requests it holds (engine thread)."""
        ...

    def abort(self, request_id: str, reason: str) -> bool:
        """End the request if this duty holds it; a no-op otherwise. True when it held the request,
        ending now or already (engine thread)."""
        ...

    def load(self) -> DutyLoad: ...

    def role_stats(self) -> dict[str, Any]:
        """The duty's counters and queue lengths, for stats() and the node's metrics."""
        ...

    def still_held(self) -> dict[str, int]:
        """Rooms, endpoint rooms, aux slots and the like still in use: zeros when idle (check_idle)."""
        ...

    def ready_info(self) -> dict[str, Any]:
        """What ready() adds to the node's identity (a prefill duty's bootstrap address)."""
        ...

    def close(self) -> None:
        """Close the duty's transfer endpoints, after the engine thread stopped."""
        ...
