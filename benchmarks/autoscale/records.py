"""One row per request of the load step: when it arrived (its scheduled send time, seconds from the
run's start), its phase, how it ended, and its client-side TTFT and TPOT.

Status, from bench serve's client's error kinds (benchmarks/serve/client.py):
    200         the stream completed (`data: [DONE]`)
    429         refused by admission (http_429)
    503         unavailable (http_503)
    other       any other HTTP status, or a 200 whose stream broke (stream_error, malformed)
    exception   no answer: connect, disconnected, timeout, `cancelled` (still open when the run's
                bounded drain ended) or `unsent` (the client's bound on open requests held it back)
A request meets the SLO when its status is 200, its TTFT <= the TTFT target and its TPOT <= the
TPOT target (a one-token answer has no TPOT and meets it): bench serve's SLO.met. Every request
that is not 200 is lost.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from raypd.benchmarks.serve.client import Result
from raypd.benchmarks.serve.metrics import SLO

Status = Literal["200", "429", "503", "other", "exception"]
STATUSES: tuple[Status, ...] = ("200", "429", "503", "other", "exception")
ANSWERED_THEN_BROKE = frozenset({"stream_error", "malformed"})
UNSENT = "unsent"
COLUMNS = ("at_s", "phase", "status", "error", "ttft_s", "tpot_s", "sent_s", "end_s")


def status_of(error: str | None) -> Status:
    if error is None:
        return "200"
    if error == "http_429":
        return "429"
    if error == "http_503":
        return "503"
    if error.startswith("http_") or error in ANSWERED_THEN_BROKE:
        return "other"
    return "exception"


@dataclass(frozen=True, slots=True)
class Record:
    at_s: float               # scheduled send time, from the run's start (its bucket is by this)
    phase: str
    status: Status
    error: str | None = None  # the client's error kind, None for 200
    ttft_s: float | None = None
    tpot_s: float | None = None
    sent_s: float | None = None   # when it was sent (None: never sent)
    end_s: float | None = None    # when it ended, answer or error (None: never sent)

    @property
    def lost(self) -> bool:
        return self.status != "200"

    def meets(self, slo: SLO) -> bool:
        if self.status != "200" or self.ttft_s is None or self.ttft_s > slo.ttft_s:
            return False
        return self.tpot_s is None or self.tpot_s <= slo.tpot_s

    def row(self) -> list:
        """The record as a JSON row, in COLUMNS' order."""
        return [_r(self.at_s), self.phase, self.status, self.error, _r(self.ttft_s), _r(self.tpot_s), _r(self.sent_s),
                _r(self.end_s)]


def from_result(at_s: float, phase: str, res: Result, end_s: float | None) -> Record:
    return Record(at_s, phase, status_of(res.error), res.error, res.ttft_s, res.tpot_s, res.start_s, end_s)


def unsent(at_s: float, phase: str) -> Record:
    return Record(at_s, phase, "exception", UNSENT)


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 4)
