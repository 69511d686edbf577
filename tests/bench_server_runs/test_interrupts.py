"""run_async: a signal during a benchmark's run cancels it, lets its clean-up run, then ends it
with Terminated (not swallowed by whichever request task it lands in); a run's value comes back."""
from __future__ import annotations

import asyncio
import os
import signal

import pytest

from raypd.benchmarks.server_runs.interrupts import Terminated, run_async


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_the_run_cancels_it_cleans_up_and_ends_it(sig):
    cleaned = []

    async def run():
        try:
            os.kill(os.getpid(), sig)
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0)  # the clean-up may still await (cancelling open requests)
            cleaned.append(True)

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated):
        run_async(run())
    assert cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) is before  # the handlers in place before are back


def test_the_run_s_value_comes_back():
    async def run():
        return 42
    assert run_async(run()) == 42
