"""Time models behind the cost policy, fitted from what nodes measure.

PrefillTimeModel: seconds to prefill n_new tokens on top of n_cached cached ones on a node whose
measured speed is `speed` tokens/s:

    t = overhead + n_new / speed * (1 + k * (n_cached + n_new / 2))

The bracket is the attention term (each new token attends to the cached context and, on average,
half of the new part). `speed` is each node's own moving average (LoadReport.prefill_tokens_per_s);
`k` starts from the model shape and is refitted by least squares from observed prefill times.

DecodeStepModel: one decode step of a batch of b sequences takes a + b_coeff * b seconds; refitted
from decode nodes' reports (running, step_time_s) over a sliding window (only a, when the batch
sizes seen do not spread enough to fit the slope).
"""
from __future__ import annotations

from collections import deque

import numpy as np

MIN_SAMPLES = 8
REFIT_EVERY = 16   # refitting on every report would cost more than routing; the fit moves slowly


class PrefillTimeModel:
    def __init__(self, default_speed: float, attention_coeff: float, overhead_s: float, window: int = 512):
        self.default_speed = default_speed
        self.k = attention_coeff
        self.overhead_s = overhead_s
        self._samples: deque[tuple[float, float]] = deque(maxlen=window)
        self._seen = 0

    def estimate(self, n_new, n_cached, speed):
        """Vectorized over numpy arrays (or plain floats)."""
        n_new = np.maximum(n_new, 1)
        return self.overhead_s + n_new / speed * (1.0 + self.k * (n_cached + 0.5 * n_new))

    def speeds(self, reported: np.ndarray) -> np.ndarray:
        """Reported speeds with 0 (no measurement yet) replaced by the fleet median or default."""
        known = reported > 0
        if known.all():
            return reported
        fallback = float(np.median(reported[known])) if known.any() else self.default_speed
        return np.where(known, reported, fallback)

    def observe(self, n_new: int, n_cached: int, seconds: float, speed: float) -> None:
        """One measured prefill; refits k when enough samples spread over context lengths."""
        if n_new <= 0 or seconds <= self.overhead_s or speed <= 0:
            return
        x = n_cached + 0.5 * n_new
        y = (seconds - self.overhead_s) * speed / n_new - 1.0   # = k * x for a perfect model
        self._samples.append((x, y))
        self._seen += 1
        if len(self._samples) >= MIN_SAMPLES and self._seen % REFIT_EVERY == 0:
            xs = np.array([s[0] for s in self._samples])
            ys = np.array([s[1] for s in self._samples])
            denom = float(xs @ xs)
            if denom > 0:
                self.k = max(0.0, float(xs @ ys) / denom)


class DecodeStepModel:
    def __init__(self, base_s: float, per_seq_s: float, window: int = 256):
        self.base_s = base_s
        self.per_seq_s = per_seq_s
        self._samples: deque[tuple[float, float]] = deque(maxlen=window)
        self._seen = 0

    def step_time(self, batch):
        return self.base_s + self.per_seq_s * np.maximum(batch, 1)

    def observe(self, batch: float, step_time_s: float) -> None:
        if batch <= 0 or step_time_s <= 0:
            return
        self._samples.append((batch, step_time_s))
        self._seen += 1
        if len(self._samples) < MIN_SAMPLES or self._seen % REFIT_EVERY:
            return
        b = np.array([s[0] for s in self._samples])
        t = np.array([s[1] for s in self._samples])
        if np.ptp(b) >= 1:
            slope, base = np.polyfit(b, t, 1)
            if slope > 0 and base >= 0:
                self.per_seq_s, self.base_s = float(slope), float(base)
                return
        # One batch size only (the slope is not identifiable) or a fit that makes no sense: keep the
        # slope and move the base so the model meets what the nodes measure. A prior calibrated on
        # another machine would otherwise stay wrong for good (4x on a slower CPU).
        self.base_s = max(0.0, float(np.mean(t - self.per_seq_s * b)))
