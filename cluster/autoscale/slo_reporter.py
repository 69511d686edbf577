"""SloReporter: an ingress replica's side of the autoscaler's SLO signal. The replica's request
records count each finished request into a SloTally (cluster/openai/metrics.py); every every_s
this sends what was counted to the node pool (NodePool.report_slo), which judges attainment over its
window. A report that cannot be sent is dropped, not retried: the next one carries on, and a pool
that is away cannot scale anyway.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from raypd.cluster.autoscale.slo_counts import SloCounts, SloTally

log = logging.getLogger(__name__)


class SloReporter:
    def __init__(self, tally: SloTally, send: Callable[[SloCounts], Awaitable[object]], every_s: float = 2.0,
                 timeout_s: float = 5.0):
        self.tally = tally
        self.send = send
        self.every_s = every_s
        self.timeout_s = timeout_s
        self._task: asyncio.Task | None = None
        self._failing = False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def report(self) -> SloCounts:
        """Send what was counted since the last report (nothing when nothing was); what was sent."""
        counts = self.tally.take()
        if counts == SloCounts.ZERO:
            return counts
        try:
            await asyncio.wait_for(self.send(counts), self.timeout_s)
        except Exception as e:  # noqa: BLE001 - dropped: the window fills again from the next ones
            if not self._failing:
                log.warning("cannot send SLO counts to the node pool (dropping them): %s", e)
            self._failing = True
            return SloCounts.ZERO
        self._failing = False
        return counts

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            await self.report()
