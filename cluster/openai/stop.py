"""Stop strings, applied to detokenized text at the ingress (the nodes see only token ids).

A stop string may arrive split over several deltas, so the tail of the text that could still
become a stop string is held back until the next delta decides it: a client never sees text that
a later stop string would have cut. The held tail is always the longest suffix that is a prefix of
some stop string, so a match can never begin inside text already released.
"""
from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False

    def feed(self, delta: str) -> str:
        """Text safe to release after `delta`; once a stop string is found, the text before it and
        `stopped` becomes True (the stop string itself is not part of the output, as in the API)."""
        if self.stopped:
            return ""
        if not self.stops:
            return delta
        text = self._held + delta
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return text[:cut]
        keep = self._partial_suffix(text)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def flush(self) -> str:
        """At the end of the output the held tail is plain text after all."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        longest = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:n]):
                    longest = n
                    break
        return longest
