"""Terminated and run_async: a benchmark's asyncio run that Ctrl-C and SIGTERM end with its clean-up.

A Python signal handler that raises inside the event loop ends whichever task it lands in (a
request's), not the run; run_async installs the loop's own handlers instead, which cancel the main
task, whose clean-up (cancelling open requests) then runs, and only then raises Terminated. Outside
the loop (between runs), raise_terminated turns SIGTERM into the same exception, so one `except
(KeyboardInterrupt, Terminated)` stops the servers either way.
"""
from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Terminated(BaseException):
    """SIGTERM (or SIGINT inside a run) asked the benchmark to stop."""


def raise_terminated(signum: int, frame: object) -> None:
    """A SIGTERM handler for the time between runs."""
    raise Terminated()


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(coro)'s result, where SIGINT and SIGTERM cancel the run and then raise Terminated.
    The handlers in place before are put back afterwards."""
    caught: list[int] = []
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    async def guarded() -> T:
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        assert task is not None

        def cancel(sig: int) -> None:
            caught.append(sig)
            task.cancel()

        for sig in before:
            loop.add_signal_handler(sig, cancel, sig)
        return await coro

    try:
        return asyncio.run(guarded())
    except asyncio.CancelledError:
        if not caught:
            raise
        raise Terminated() from None
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
