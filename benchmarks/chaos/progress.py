"""The progress bar on stderr (tqdm): requests done in the fault-free run; seconds of the chaos run,
with requests ok and failed and kills done so far."""
from __future__ import annotations

import asyncio
import importlib
import sys
import time

from raypd.benchmarks.chaos.driver import Record


class Progress:
    def __init__(self, desc: str, total: float, unit: str):
        self.unit = unit
        tqdm = importlib.import_module("tqdm").tqdm  # a dependency without type stubs
        self.bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                        bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} {unit} [{elapsed}<{remaining}{postfix}]")
        self.ok = self.failed = self.kills = 0

    def record(self, rec: Record) -> None:
        if rec.outcome.ok:
            self.ok += 1
        else:
            self.failed += 1
        if self.unit == "req":
            self.bar.update(1)
        self._postfix()

    def killed(self, _kill: object) -> None:
        self.kills += 1
        self._postfix()

    async def follow_clock(self, t0: float, end: float) -> None:
        """For a bar in seconds: advance it with time.monotonic() from t0 to end."""
        while True:
            now = time.monotonic()
            self.bar.n = min(float(self.bar.total), now - t0)
            self.bar.refresh()
            if now >= end:
                return
            await asyncio.sleep(min(1.0, end - now))

    def close(self) -> None:
        self.bar.close()

    def _postfix(self) -> None:
        fields = {"ok": self.ok, "failed": self.failed}
        if self.unit != "req":
            fields["kills"] = self.kills
        self.bar.set_postfix(fields, refresh=False)
