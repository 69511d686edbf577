"""A node answers the node pool's probe and the Conductor heartbeat without waiting for its engine
thread: with the engine thread held for real (a call that runs on it for several seconds, as a long
step would), published_load() answers at once and says how long the turn has run, while
load_report(), asked of the engine thread, waits for the turn to end. In this process, no Ray."""
from __future__ import annotations

import asyncio
import time

from raypd.node.mixed_node import MixedNode
from raypd.node.node_core import PUBLISH_EVERY_S

HOLD_S = 6.0


def test_published_load_answers_during_a_long_turn_and_says_how_long_it_ran():
    async def run():
        node = MixedNode("probe-mixed", engine_options={"num_blocks": 16})
        try:
            before = await node.published_load()
            assert before.stalled_s < HOLD_S and before.total_blocks == 16
            held = asyncio.wrap_future(node.core.loop.call(time.sleep, HOLD_S))  # the engine thread is busy
            await asyncio.sleep(1.5)
            during = await asyncio.wait_for(node.published_load(), HOLD_S / 2)  # never waits for the turn
            # The turn began a moment after it was queued, and the report is up to one publish old
            # (seen: 1.498 s under a full suite); an engine thread that reported no stall says ~0.
            assert during.stalled_s >= 1.5 - 3 * PUBLISH_EVERY_S and not held.done()
            fresh = asyncio.ensure_future(node.load_report())                # waits for the turn to end
            await asyncio.sleep(0.1)
            assert not fresh.done()
            await held
            assert (await asyncio.wait_for(fresh, 10)).total_blocks == 16
            deadline = time.monotonic() + 10
            while (await node.published_load()).stalled_s >= 1.0:  # the turn ends: no stall any more
                assert time.monotonic() < deadline, "stalled_s did not drop once the turn ended"
                await asyncio.sleep(0.01)
        finally:
            await node.shutdown()
    asyncio.run(run())
