"""NodeActor: the Ray-callable surface every node class shares, over one NodeCore and one NodeDuty.

A role class (PrefillNode, DecodeNode, MixedNode, FlexNode) builds its core, builds its duty on it,
hands both here, and adds only the calls of its own role (prefill, generate, set_duty...). What the
Conductor, the node pool, the benches and the tests call on every node lives here once: identity,
load, stats, KV events and snapshots, idleness, the Conductor link, abort, the chaos hooks, shutdown.
"""
from __future__ import annotations

from typing import Any, ClassVar

from raypd.node.node_core import NodeCore
from raypd.node.node_duty import NodeDuty
from raypd.protocol.messages import KVEventBatch, LoadReport
from raypd.protocol.roles import Role


class ChaosHooksDisabled(PermissionError):
    """A chaos hook was called on a node built without them."""


class NodeActor:
    role: ClassVar[Role]

    def __init__(self, core: NodeCore, duty: NodeDuty):
        """Start serving `duty` on `core`'s engine thread."""
        self.core, self.duty = core, duty
        self.name, self.host = core.name, core.host
        core.start(duty)

    async def ready(self) -> dict:
        return self.core.info(**self.duty.ready_info())

    async def abort(self, request_id: str, reason: str = "aborted by the client") -> None:
        """End the request; one that has not arrived yet is refused when it does (EarlyAborts)."""
        await self.core.call(self._abort, request_id, reason)

    async def load_report(self) -> LoadReport:
        """The engine's load now (asked on the engine thread: it waits for the current step)."""
        return await self.core.call(self._load_report)

    async def published_load(self) -> LoadReport:
        """The engine's last published load and how long its current turn has run, without waiting
        for the engine thread: what the node pool's probe and the Conductor heartbeat read."""
        return self.core.published_load()

    async def stats(self) -> dict:
        return await self.core.call(self._stats)

    async def drain_kv_events(self) -> KVEventBatch:
        return await self.core.call(self.core.drain_kv_events)

    async def kv_snapshot(self) -> tuple[int, list]:
        return await self.core.call(self.core.kv_snapshot)

    async def check_idle(self) -> dict:
        return await self.core.call(self._check_idle)

    async def admit_peers(self, keys: dict[str, str]) -> int:
        """Register peers' data-plane keys (principal -> Z85 public key): the node pool's call when it
        adds a node, and after this node restarted (its constructor's list may predate later nodes)."""
        return self.core.admit_peers(keys)

    async def attach_conductor(self, conductor: Any) -> None:
        await self.core.attach_conductor(conductor, self)

    async def crash_engine(self) -> None:
        """Chaos testing: crash this node's engine thread (node/node_core.py says what follows).
        ChaosHooksDisabled unless the node was built with chaos_hooks."""
        self._check_chaos_hooks("crash_engine")
        self.core.crash_engine()

    async def hold_steps(self, seconds: float) -> None:
        """Chaos testing: this node runs no engine step for `seconds` while it stays up and answers
        (NodeCore.hold_steps): a slow node on any model. ChaosHooksDisabled unless built with chaos_hooks."""
        self._check_chaos_hooks("hold_steps")
        self.core.hold_steps(seconds)

    async def fail_requests(self, n: int) -> int:
        """Chaos testing: fail the next n streamed requests at once, while the node stays up
        (NodeCore.fail_requests). ChaosHooksDisabled unless the node was built with chaos_hooks."""
        self._check_chaos_hooks("fail_requests")
        return await self.core.fail_requests(n)

    async def shutdown(self) -> None:
        self.core.shutdown()
        self.duty.close()

    def _check_chaos_hooks(self, hook: str) -> None:
        if not self.core.chaos_hooks:
            raise ChaosHooksDisabled(f"node {self.name}: {hook}() is a chaos hook, off unless the node is started "
                                     f"with chaos hooks (raypd serve --chaos-hooks)")

    # -- engine thread ----------------------------------------------------------------------------
    def _load_report(self) -> LoadReport:
        return self.core.load_report(self.duty.load(), stats=self.duty.role_stats())

    def _abort(self, request_id: str, reason: str) -> None:
        if not self.duty.abort(request_id, reason):
            self.core.early_aborts.remember(request_id, reason)

    def _stats(self) -> dict:
        return self.core.stats(**self.duty.role_stats())

    def _check_idle(self) -> dict:
        return self.core.check_idle(**self.duty.still_held())
