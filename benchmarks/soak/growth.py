"""Growth of one sampled quantity (RSS, file descriptors, threads) over the measured window.

    baseline   the first sample at or after the end of the warm-up (t >= warmup_s)
    end        the mean of the last `tail` samples at or before the end of the load (t <= end_s);
               fewer when the window holds fewer than 2 x tail samples (at least 1)
    growth     end - baseline;  growth_pct = 100 x growth / baseline

`window_max` is the largest sample in the window and `window_min` the smallest: a quantity can
come back down by the end after a rise, which a growth of 0 would hide. A process that was not
alive both at the baseline and through the end has no growth (None).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Growth:
    baseline_t_s: float
    baseline: float
    end: float
    tail: int                 # how many samples `end` averages
    window_min: float
    window_max: float
    samples: int              # in the window

    @property
    def growth(self) -> float:
        return self.end - self.baseline

    @property
    def growth_pct(self) -> float | None:
        return 100.0 * self.growth / self.baseline if self.baseline else None


def growth(t_s: list[float], values: list[float], warmup_s: float, end_s: float, tail: int) -> Growth | None:
    """The growth of `values` (sampled at `t_s`, ascending) between warmup_s and end_s."""
    if tail < 1:
        raise ValueError("tail must be >= 1")
    window = [(t, v) for t, v in zip(t_s, values) if warmup_s <= t <= end_s]
    if not window:
        return None
    n = max(1, min(tail, len(window) // 2))
    last = [v for _, v in window[-n:]]
    return Growth(baseline_t_s=window[0][0], baseline=float(window[0][1]), end=sum(last) / n, tail=n,
                  window_min=float(min(v for _, v in window)), window_max=float(max(v for _, v in window)),
                  samples=len(window))


def alive_through(t_s: list[float], warmup_s: float, end_s: float, period_s: float) -> bool:
    """Whether a series has samples from (about) the warm-up's end to (about) the load's end: a process
    that started late or exited early is reported, not compared."""
    if not t_s:
        return False
    first = next((t for t in t_s if t >= warmup_s), None)
    last = max((t for t in t_s if t <= end_s), default=None)
    return first is not None and last is not None and first <= warmup_s + 1.5 * period_s \
        and last >= end_s - 1.5 * period_s
