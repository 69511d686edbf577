"""A node's step counters (node/engine_loop.py, carried by every LoadReport as `steps` and
`step_s_total`): every engine step counted once with its wall time, so the difference of two reports
gives a window's mean step exactly (`raypd bench tenants` reads them), not the moving average's
mix of older steps."""
from __future__ import annotations

import threading
import time

from raypd.node.engine_loop import EngineLoop


class SleepyEngine:
    """Steps `left` times, each `step_s` long, then has nothing to do."""

    def __init__(self, left: int, step_s: float):
        self.left, self.step_s = left, step_s
        self.last_step_tokens = 1
        self.done = threading.Event()

    def has_unfinished(self) -> bool:
        return self.left > 0

    def step(self) -> list:
        time.sleep(self.step_s)
        self.left -= 1
        if not self.left:
            self.done.set()
        return []


def test_every_step_is_counted_once_with_its_wall_time():
    engine = SleepyEngine(left=5, step_s=0.02)
    loop = EngineLoop(engine, tick=lambda: False, on_outputs=lambda outputs: None,  # type: ignore[arg-type]
                      on_crash=lambda e: None, name="counters")
    loop.start()
    try:
        assert engine.done.wait(10)
        loop.call(lambda: None).result(10)  # the last step's bookkeeping is done once the next turn runs
        assert loop.num_steps == 5
        assert 5 * 0.02 <= loop.step_s_total < 5 * 0.02 + 1.0
    finally:
        loop.stop()


class BlockedEngine:
    """Has a waiting request it never has room to schedule: every step is empty."""

    def __init__(self):
        self.last_step_tokens = 0
        self.steps_asked = 0

    def has_unfinished(self) -> bool:
        return True

    def step(self) -> list:
        self.steps_asked += 1
        return []


def test_a_step_that_runs_nothing_is_not_a_step_and_the_loop_waits_instead_of_spinning():
    """Requests wait for blocks that transfers hold: the loop looks again every blocked poll (5 ms) or
    at a call, rather than spinning through empty steps; the load report's counters skip them."""
    engine = BlockedEngine()
    loop = EngineLoop(engine, tick=lambda: False, on_outputs=lambda outputs: None,  # type: ignore[arg-type]
                      on_crash=lambda e: None, name="blocked")
    loop.start()
    try:
        time.sleep(0.5)
        asked, empty = loop.call(lambda: (engine.steps_asked, loop.num_empty_steps)).result(10)
        # A spinning loop asks tens of thousands of times in half a second; one that waits 5 ms between
        # looks, at most ~100 (a call or two wake it early).
        assert 1 <= asked <= 200, asked
        assert (loop.num_steps, loop.step_s_total, loop.step_time_s) == (0, 0.0, 0.0)
        assert empty == asked
    finally:
        loop.stop()


def test_held_steps_wait_while_calls_still_run_then_the_steps_resume():
    """hold_steps (a chaos hook): no step for the hold's length, calls answered meanwhile, and the
    steps that were due run once it ends."""
    engine = SleepyEngine(left=3, step_s=0.0)
    loop = EngineLoop(engine, tick=lambda: False, on_outputs=lambda outputs: None,  # type: ignore[arg-type]
                      on_crash=lambda e: None, name="held")
    loop.hold_steps(60.0)
    loop.start()
    try:
        assert loop.call(lambda: engine.left).result(10) == 3   # the loop answers; nothing stepped
        assert not engine.done.wait(0.3) and loop.num_steps == 0
        loop.hold_steps(0.0)
        assert engine.done.wait(10)
    finally:
        loop.stop()
