"""EarlyAborts: aborts that reached a node before the request they name.

A caller gives up on a request (its client left, the other node failed) and tells both nodes to
abort it; Ray does not keep one caller's calls to an actor in order, and a node that was paused or
busy may take the abort first. Without a memory of it, the request arriving next would hold a room,
a reservation or a stream for its whole bootstrap timeout, serving nobody. The node keeps the ids of
aborts for requests it does not hold, for a while and up to a bound, and refuses such a request
the moment it arrives. Request ids are unique per attempt (retries and replays take new ones), so
a remembered id is never a request someone still wants.

Engine thread only (the node's abort and add paths run there), so no lock.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

CAPACITY = 4096      # ids kept at most (oldest dropped first): a flood of stray aborts stays bounded
KEEP_S = 120.0       # longer than any bootstrap or prealloc timeout a late request could wait out


class EarlyAborts:
    def __init__(self, capacity: int = CAPACITY, keep_s: float = KEEP_S,
                 clock: Callable[[], float] = time.monotonic):
        self.capacity, self.keep_s, self._clock = capacity, keep_s, clock
        self._ids: OrderedDict[str, tuple[float, str]] = OrderedDict()   # id -> (when, reason), oldest first
        self.num_refused = 0   # requests refused on arrival because their abort came first

    def __len__(self) -> int:
        return len(self._ids)

    def remember(self, request_id: str, reason: str) -> None:
        """An abort for a request this node does not hold (yet, or any more)."""
        self._expire()
        self._ids.pop(request_id, None)
        self._ids[request_id] = (self._clock(), reason)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def take(self, request_id: str) -> str | None:
        """The abort's reason when `request_id` was aborted before it arrived (then forgotten), else None."""
        self._expire()
        entry = self._ids.pop(request_id, None)
        if entry is None:
            return None
        self.num_refused += 1
        return entry[1]

    def _expire(self) -> None:
        horizon = self._clock() - self.keep_s
        while self._ids and next(iter(self._ids.values()))[0] < horizon:
            self._ids.popitem(last=False)
