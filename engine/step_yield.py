"""Yielding steps: how long a favoured request waits for the step in flight.

A node's step cannot be stopped once it runs, so a request that arrives waits for the step in flight
before its own, whatever its priority or its tenant's share: on a CPU a step of 512 prompt tokens
takes longer than an interactive prompt's whole prefill. So while requests of more than one class
(priority, tenant) reach a node, the requests of the classes that rank after the favoured one yield:

    class      a request's (priority, tenant)
    about      the classes that sent this node a request within the last `window_s`
    rank       (priority, the class's service rate: prompt and output tokens this node computed for
               it within the window, per second it has been about within the window, at least
               one), smallest first: the most urgent priority, then the class served at the lowest
               rate lately
    favoured   the first of the classes about by rank
    yields     a prompt whose class ranks strictly after the favoured one

A step computes at most `step_tokens` prompt tokens of yielding requests, and none while a
favoured prompt can run in it: a favoured arrival then waits for one small step at most, and its
own step costs what it costs alone. Decodes never yield (a step puts them first anyway).
Work-conserving: when no favoured prompt waits or can start, the yielding prompts take their
`step_tokens`; with one class about (one tenant at one priority: the common case) nothing yields and
steps are as before. The price is smaller prompt steps for the classes served more while a class
served less is about (more steps for the same tokens), paid only under contention.

Why a rate over a window and not the waiting queue's Virtual Token Counters (protocol/fair_share.py):
a counter moves by a whole prompt each time a tenant is served, so right after an interactive
tenant's request the flood's counter is the lower one and the flood would take a whole step just
when the tenant's next request may come. And why a rate, not the tokens: a tenant served alone for
the window before a flood came has more tokens in it than the flood for its first seconds, though
the flood takes five times its rate from then on. The tenant that asks a third of the capacity stays
the one served at the lower rate, and the flood keeps yielding while it is about.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from raypd.protocol.sampling_params import SamplingParams

# Classes remembered at most; past it the longest unseen is forgotten (a flood of made-up tenant
# names must not grow a node's step work).
MAX_CLASSES = 1024

Rank = tuple[int, float]  # (priority, tokens computed per second about, within the window)


@dataclass(slots=True)
class _Class:
    first_arrival: float  # since it is about (it was forgotten before, if it came before)
    last_arrival: float
    served: deque[tuple[float, int]] = field(default_factory=deque)  # (when, tokens), oldest first
    total: int = 0  # the sum of `served`


class RecentClasses:
    """The classes about a node and the tokens it computed for each lately, the longest unseen first."""

    def __init__(self, window_s: float):
        self.window_s = window_s
        self._classes: dict[tuple[int, str], _Class] = {}
        self._ranks: dict[tuple[int, str], Rank] = {}  # as of the last favoured()

    def saw(self, params: SamplingParams, now: float) -> None:
        key = (params.priority, params.tenant)
        cls = self._classes.pop(key, None) or _Class(now, now)  # to the end: the dict stays in order of arrival
        cls.last_arrival = now
        self._classes[key] = cls
        if len(self._classes) > MAX_CLASSES:
            del self._classes[next(iter(self._classes))]

    def charge(self, params: SamplingParams, tokens: int, now: float) -> None:
        cls = self._classes.get((params.priority, params.tenant))
        if cls is not None:
            cls.served.append((now, tokens))
            cls.total += tokens

    def rank(self, params: SamplingParams) -> Rank:
        """The class's rank as of the last favoured() (a class not about then: served nothing)."""
        return self._ranks.get((params.priority, params.tenant), (params.priority, 0.0))

    def yields(self, params: SamplingParams, favoured: Rank | None) -> bool:
        """Whether a request with these params yields to the favoured class (favoured(): None when
        nothing yields): its class ranks strictly after it."""
        return favoured is not None and self.rank(params) > favoured

    def favoured(self, now: float) -> Rank | None:
        """The rank of the favoured class, or None when fewer than two classes are about (nothing
        yields). Forgets the classes not seen within the window, and tokens computed before it."""
        self._ranks = {}
        if len(self._classes) < 2:
            return None
        horizon = now - self.window_s
        while self._classes and next(iter(self._classes.values())).last_arrival < horizon:
            del self._classes[next(iter(self._classes))]
        if len(self._classes) < 2:
            return None
        for key, cls in self._classes.items():
            while cls.served and cls.served[0][0] < horizon:
                cls.total -= cls.served.popleft()[1]
            about_s = max(1.0, now - max(cls.first_arrival, horizon))
            self._ranks[key] = (key[0], cls.total / about_s)
        return min(self._ranks.values())
