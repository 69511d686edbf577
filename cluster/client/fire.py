"""fire(): let a Ray call run without awaiting it, and swallow its outcome.

For calls whose answer nobody needs and whose target may be dead: an abort sent to a node after its
request is over for the caller, a death reported to the Conductor. Each is still bounded in time, so
a hung peer leaves no task behind for long.
"""
from __future__ import annotations

import asyncio
from typing import Any


def fire(ref: Any, timeout_s: float) -> None:
    """Await `ref` (an ObjectRef or any awaitable) in the background, at most timeout_s."""
    async def _await() -> None:
        try:
            await asyncio.wait_for(ref, timeout_s)
        except Exception:  # noqa: BLE001 - best effort by contract: the caller has its own backstop
            pass
    asyncio.ensure_future(_await())
