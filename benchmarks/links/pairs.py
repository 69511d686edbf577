"""What `raypd bench links` measures between two hosts, and the link figures drawn from it.

One ordered pair (src writes into dst's pool): W warm-up writes of one block (UCX wires a new peer up
during the first few), then R writes of one block (small) and R writes of the whole pool (big), each
timed by the sender's room record from the write posted to the bytes at the peer (t_landed -
t_posted, as benchmarks/kv_transfer.py times its writes). The pair's figures are medians of the R:
bandwidth = the big write's bytes / its time; latency = the small write's time (one block, 4 KiB by
default: on a real network its own bytes add microseconds at most). An undirected link (the
topology's links have one figure for both directions) takes the slower direction: the lower
bandwidth and the higher latency of the directions measured.
"""
from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Host:
    ip: str             # the topology names hosts by IP: it survives a Ray restart (node ids do not)
    node_id: str
    hostname: str
    tor_label: str | None = None    # Ray's raypd.io/tor label, if any: only to name a measured rack


@dataclass(frozen=True, slots=True)
class WritePlan:
    warmup: int
    reps: int
    block_bytes: int
    blocks: int          # of the big write: the whole pool

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.reps < 1 or self.block_bytes < 1 or self.blocks < 2:
            raise ValueError(f"bad write plan {self}: reps >= 1, warmup >= 0, a pool of >= 2 blocks")

    def block_counts(self) -> list[int]:
        """Blocks of each write, in order: warm-up, small, big."""
        return [1] * (self.warmup + self.reps) + [self.blocks] * self.reps


@dataclass(frozen=True, slots=True)
class LinkFigure:
    gbps: float          # GB/s (1e9 bytes per second), one direction
    latency_us: float


@dataclass(frozen=True, slots=True)
class PairResult:
    src: str             # host IPs; equal for the same-host pair (two probes on one machine)
    dst: str
    ok: bool
    reason: str = ""                         # why the pair failed ("" when ok)
    small_bytes: int = 0
    big_bytes: int = 0
    small_write_s: tuple[float, ...] = ()    # every timed write, warm-up left out
    big_write_s: tuple[float, ...] = ()
    room_s: float | None = None              # median small write posted -> receiver's Done seen
    transport: dict[str, Any] = field(default_factory=dict)   # ucx_transport.PeerTransport's fields

    @property
    def figure(self) -> LinkFigure | None:
        if not self.ok or not self.small_write_s or not self.big_write_s:
            return None
        # Bandwidth from the fastest big write, not the median: on a shared CPU the reps' spread is
        # scheduling noise that only ever slows a write (one in-rack pair's median fell 10x below its
        # neighbours' beside a busy test suite and split its rack), and what the topology wants is
        # what the link can carry. Latency stays the median small write: it is what a request sees.
        big_s = max(min(self.big_write_s), 1e-9)
        return LinkFigure(self.big_bytes / big_s / 1e9, statistics.median(self.small_write_s) * 1e6)


def undirected(results: Iterable[PairResult]) -> dict[frozenset[str], LinkFigure]:
    """Each measured pair of distinct hosts, either direction, as one figure: the slower direction."""
    out: dict[frozenset[str], LinkFigure] = {}
    for r in results:
        f = r.figure
        if f is None or r.src == r.dst:
            continue
        key = frozenset((r.src, r.dst))
        seen = out.get(key)
        out[key] = f if seen is None else LinkFigure(min(seen.gbps, f.gbps), max(seen.latency_us, f.latency_us))
    return out
