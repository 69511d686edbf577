"""A request's total deadline (`--request-timeout`), in event-loop time.

The clock starts when the request reaches the ingress app (guard.py stamps it into the scope, so the
body's upload counts too). `until()` bounds one await; `events_until()` bounds a stream of events:
each wait for the next event ends at the deadline. Either way the work waited for is cancelled, and a
choice stream that is cancelled closes its driver streams, which abort the request on both nodes
(serve/generation.py): a request past its deadline holds nothing anywhere.

asyncio.wait_for rather than asyncio.timeout_at, which Python 3.10 lacks; the task it makes per
event costs microseconds next to a token's milliseconds.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from typing import TypeVar

from raypd.cluster.openai.api_errors import APIError, GatewayTimeout

T = TypeVar("T")
E = TypeVar("E")


def timed_out() -> APIError:
    return GatewayTimeout("the request did not finish within the server's request timeout "
                          "(raypd serve --request-timeout)", code="request_timeout")


async def until(deadline: float | None, work: Awaitable[T], expired: Callable[[], APIError] = timed_out) -> T:
    """`await work`; once `deadline` passes, the work is cancelled and `expired()` raised."""
    if deadline is None:
        return await work
    loop = asyncio.get_running_loop()
    try:
        return await asyncio.wait_for(work, max(0.0, deadline - loop.time()))
    except asyncio.TimeoutError:
        if loop.time() < deadline:  # the work's own timeout, not ours
            raise
        raise expired() from None


async def events_until(deadline: float, events: AsyncGenerator[E, None]) -> AsyncGenerator[E, None]:
    """`events` until `deadline`; then GatewayTimeout, with `events` cancelled and closed."""
    async with aclosing(events):
        while True:
            try:
                event = await until(deadline, anext(events))
            except StopAsyncIteration:
                return
            yield event
