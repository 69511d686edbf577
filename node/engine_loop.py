"""EngineLoop: the one thread that owns a node's LLMEngine.

Everything that touches the engine - adding, aborting, stepping, reserving blocks, reading stats -
runs on this thread, so the engine needs no locks. Ray's asyncio thread hands work over with
`call()` (a concurrent Future) or `acall()` (awaitable). Each turn: run queued calls, let the node
advance its own queues (`tick`, which also says whether transfers are in flight and need polling),
then run one engine step if anything is scheduled.

stalled_s() says how long the current turn has run, read from any thread: about one step on a
healthy loop, growing without bound on a step that never ends. The node pool judges a node hung by
it (cluster/serve/supervisor.py), not by how long a call waits behind a long step.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from raypd.engine.outputs import StepOutput

if TYPE_CHECKING:  # torch: only a type here; a process that holds a node's handle imports this module
    from raypd.engine.engine import LLMEngine

log = logging.getLogger(__name__)


class NodeCrashedError(RuntimeError):
    """The engine thread died; the node serves no more requests."""


class InjectedCrash(RuntimeError):
    """Raised on the engine thread by inject_crash(): chaos tests crash a node's engine for real."""


class EngineLoop:
    def __init__(self, engine: LLMEngine, tick: Callable[[], bool], on_outputs: Callable[[list[StepOutput]], None],
                 on_crash: Callable[[BaseException], None], name: str,
                 busy_poll_s: float = 0.0005, idle_poll_s: float = 0.05, blocked_poll_s: float = 0.005):
        self.engine = engine
        self._tick = tick
        self._on_outputs = on_outputs
        self._on_crash = on_crash
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._busy_poll_s, self._idle_poll_s = busy_poll_s, idle_poll_s
        # Waiting requests that the last step could not schedule: a call, a tick or a finished step of
        # the engine's own (overlap) may free room soon, so look again sooner than when idle.
        self._blocked_poll_s = blocked_poll_s
        self.num_empty_steps = 0  # steps that scheduled nothing and returned nothing (not in the averages)
        self.crashed: BaseException | None = None
        self._crash_requested: str | None = None
        self._steps_held_until = 0.0  # monotonic; before it no step runs (hold_steps, a chaos hook)
        # Moving averages the load report and the Conductor's prefill-time model use.
        self.step_time_s = 0.0
        self.tokens_per_s = 0.0
        self.num_steps = 0
        self.step_s_total = 0.0  # every step's wall time, summed
        self._turn_began: float | None = None  # monotonic; None while the thread waits for work
        self._thread = threading.Thread(target=self._run, name=f"engine-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def call(self, fn: Callable, *args) -> Future:
        """Run fn(*args) on the engine thread between steps."""
        fut: Future = Future()
        if self.crashed is not None:
            fut.set_exception(NodeCrashedError(f"engine thread crashed: {self.crashed!r}"))
            return fut
        self._calls.put((fn, args, fut))
        self._wake.set()
        if self.crashed is not None:  # it crashed while we queued: nobody will run the call
            self._fail_pending_calls(self.crashed)
        return fut

    async def acall(self, fn: Callable, *args, timeout: float = 60.0):
        return await asyncio.wait_for(asyncio.wrap_future(self.call(fn, *args)), timeout)

    def inject_crash(self, reason: str = "injected engine crash") -> None:
        """Make the engine thread raise InjectedCrash at its next turn, as a bug in a step would
        (the chaos benchmark and the failure tests use this; nothing in serving calls it)."""
        self._crash_requested = reason
        self._wake.set()

    def hold_steps(self, seconds: float) -> None:
        """Run no engine step for the next `seconds` (0 ends a hold) while calls and ticks go on:
        requests arrive, wait and abort, transfers move, probes answer. Chaos tests use it for a node
        that is slow but alive, whatever the model's speed; nothing in serving calls it."""
        self._steps_held_until = time.monotonic() + max(0.0, seconds)
        self._wake.set()

    def stalled_s(self) -> float:
        """How long the current turn (calls, tick, step) has been running; 0 while it waits for work."""
        began = self._turn_began
        return 0.0 if began is None else max(0.0, time.monotonic() - began)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # -- the thread -------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._turn_began = time.monotonic()
                if self._crash_requested is not None:
                    raise InjectedCrash(self._crash_requested)
                self._run_calls()
                busy = self._tick()
                held_s = self._steps_held_until - time.monotonic()
                if held_s <= 0 and self.engine.has_unfinished() and self._step():
                    continue
                # Nothing to run, or nothing could run (waiting requests the pool has no room for, while
                # the blocks they need are held by transfers or reservations): wait for a call or for
                # the next poll instead of spinning through empty steps, which would take a core from
                # the node's own transfers and from every other process on the machine.
                self._turn_began = None
                wait_s = self._busy_poll_s if busy else \
                    (self._blocked_poll_s if self.engine.has_unfinished() else self._idle_poll_s)
                self._wake.wait(min(wait_s, held_s) if held_s > 0 else wait_s)
                self._wake.clear()
        except BaseException as e:  # noqa: BLE001 - the node must tell every caller, not die silently
            log.exception("engine thread crashed")
            self.crashed = e
            self._fail_pending_calls(e)
            self._on_crash(e)

    def _run_calls(self) -> None:
        while True:
            try:
                fn, args, fut = self._calls.get_nowait()
            except queue.Empty:
                return
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except Exception as e:  # the caller gets it; the loop goes on
                fut.set_exception(e)

    def _step(self) -> bool:
        """One engine step; False when it scheduled nothing and returned nothing (then it is not a step
        of the load report's counters and averages: an empty step's ~0 s would drag the step time the
        Conductor and the pool's scaler read toward zero while requests wait)."""
        t0 = time.perf_counter()
        outputs = self.engine.step()
        dt = time.perf_counter() - t0
        tokens = self.engine.last_step_tokens
        if not tokens and not outputs:
            self.num_empty_steps += 1
            return False
        self.num_steps += 1
        self.step_s_total += dt
        a = 0.2
        self.step_time_s = dt if self.num_steps == 1 else (1 - a) * self.step_time_s + a * dt
        if tokens and dt > 0:
            self.tokens_per_s = tokens / dt if not self.tokens_per_s else (1 - a) * self.tokens_per_s + a * tokens / dt
        self._on_outputs(outputs)
        return True

    def _fail_pending_calls(self, e: BaseException) -> None:
        while True:
            try:
                _, _, fut = self._calls.get_nowait()
            except queue.Empty:
                return
            if fut.set_running_or_notify_cancel():
                fut.set_exception(NodeCrashedError(f"engine thread crashed: {e!r}"))
