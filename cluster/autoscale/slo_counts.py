"""SLO counts: how many requests met their TTFT and TPOT targets, from the ingress replicas that see
them to the node pool that judges attainment over a window.

    ingress replica                      node pool
    SloTally.observe(ttft, tpot)   ->    SloWindow.add(at, counts)  (each report, stamped on arrival)
    ... every request ...                SloWindow.over(now, since=policy.changed_at)
    SloTally.take() -> SloCounts   ->      -> ScaleSignals.slo      (each tick)

Counts, not latencies, travel: they add up across replicas and reports, and attainment (the share
of requests that met a target) is what the SLO is stated in. A request refused for capacity (429 or
503: a full queue, no node) counts as a TTFT miss, so a pool that sheds its load is not meeting its
SLO. `since` lets the policy judge a changed pool only by requests that finished after the change:
the misses that called for a node must not call for another once it serves.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True, slots=True)
class SloCounts:
    """Requests that met / were measured against each target, and those refused for capacity.
    Additive: sum(reports, SloCounts.ZERO)."""
    ttft_met: int = 0
    ttft_total: int = 0       # requests whose first token came (refusals not included)
    tpot_met: int = 0
    tpot_total: int = 0       # requests with at least two output tokens
    rejected: int = 0         # refused for capacity: no first token, counted as TTFT misses

    ZERO: ClassVar[SloCounts]

    def __post_init__(self) -> None:
        if min(self.ttft_met, self.tpot_met, self.rejected) < 0 or self.ttft_met > self.ttft_total \
                or self.tpot_met > self.tpot_total:
            raise ValueError(f"inconsistent SLO counts: {self}")

    def __add__(self, other: SloCounts) -> SloCounts:
        return SloCounts(self.ttft_met + other.ttft_met, self.ttft_total + other.ttft_total,
                         self.tpot_met + other.tpot_met, self.tpot_total + other.tpot_total,
                         self.rejected + other.rejected)

    @property
    def samples(self) -> int:
        """Requests the TTFT attainment is judged over: those that got a first token or were refused."""
        return self.ttft_total + self.rejected

    @property
    def ttft_attainment(self) -> float | None:
        """Share of requests that met the TTFT target, a refusal counting as a miss; None with none."""
        return self.ttft_met / self.samples if self.samples else None

    @property
    def tpot_attainment(self) -> float | None:
        """Share of measured requests that met the TPOT target; None with none."""
        return self.tpot_met / self.tpot_total if self.tpot_total else None

    def to_dict(self) -> dict:
        return {"ttft_met": self.ttft_met, "ttft_total": self.ttft_total, "tpot_met": self.tpot_met,
                "tpot_total": self.tpot_total, "rejected": self.rejected,
                "ttft_attainment": self.ttft_attainment, "tpot_attainment": self.tpot_attainment}


SloCounts.ZERO = SloCounts()


class SloTally:
    """What one ingress replica counts between two reports: observe() per request, take() per report."""
    __slots__ = ("ttft_target_s", "tpot_target_s", "_ttft_met", "_ttft_total", "_tpot_met", "_tpot_total",
                 "_rejected")

    def __init__(self, ttft_target_s: float, tpot_target_s: float):
        if not (ttft_target_s > 0 and tpot_target_s > 0):
            raise ValueError(f"SLO targets must be > 0, got TTFT {ttft_target_s} s, TPOT {tpot_target_s} s")
        self.ttft_target_s = ttft_target_s
        self.tpot_target_s = tpot_target_s
        self._reset()

    def _reset(self) -> None:
        self._ttft_met = self._ttft_total = self._tpot_met = self._tpot_total = self._rejected = 0

    def observe(self, ttft_s: float | None, tpot_s: float | None, rejected: bool = False) -> None:
        """One finished request: its TTFT (None: no first token), its TPOT (None: fewer than two
        tokens), or `rejected` when it was refused for capacity (then its times are not looked at)."""
        if rejected:
            self._rejected += 1
            return
        if ttft_s is not None:
            self._ttft_total += 1
            self._ttft_met += ttft_s <= self.ttft_target_s
        if tpot_s is not None:
            self._tpot_total += 1
            self._tpot_met += tpot_s <= self.tpot_target_s

    def take(self) -> SloCounts:
        """The counts since the last take(), and start over."""
        out = SloCounts(self._ttft_met, self._ttft_total, self._tpot_met, self._tpot_total, self._rejected)
        self._reset()
        return out


class SloWindow:
    """The pool's reports of the last `window_s` seconds, stamped with the pool's clock on arrival."""

    def __init__(self, window_s: float):
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._reports: deque[tuple[float, SloCounts]] = deque()

    def add(self, at: float, counts: SloCounts) -> None:
        self._reports.append((at, counts))

    def over(self, now: float, since: float = -math.inf) -> SloCounts:
        """The sum of the reports that arrived in (now - window_s, now] and after `since` (the
        policy's changed_at: the pool as it is now). Reports older than the window are dropped."""
        start = now - self.window_s
        while self._reports and self._reports[0][0] <= start:
            self._reports.popleft()
        out = SloCounts.ZERO
        for at, counts in self._reports:
            if since < at <= now:
                out = out + counts
        return out
