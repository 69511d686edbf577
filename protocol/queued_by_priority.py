"""Queued prompt tokens by priority: the bounded summary a node reports
(LoadReport.queued_prefill_by_priority) and the Conductor reads to estimate one request's queueing
delay.

A node's scheduler serves its waiting queue by priority first (lower is more urgent;
engine/scheduler.py), so a new request waits behind the queued work at its own priority or a more
urgent one and overtakes the rest. Counting everything queued (LoadReport.queued_prefill_tokens)
tells an urgent request that it waits behind a batch flood it will in fact pass.

The form: ((priority, tokens), ...), distinct priorities, most urgent first, no empty entry, at most
MAX_LEVELS entries. Why the priorities that occur rather than cumulative tokens at fixed cut points:
a priority is any integer within +-PRIORITY_BOUND and a deployment uses a handful of them (an
interactive class, the default 0, a batch class), so each level present is exact where fixed cuts
would have to guess where the levels are. Past MAX_LEVELS the least urgent levels fold into the
least urgent entry kept, under its priority: a request at one of the folded priorities then counts
some work that is in fact queued behind it (an overestimate, never an under-), while a request at a
kept priority, the urgent ones this summary exists for, is still exact.

A request at priority p waits behind the queue's total less the tokens placed behind it (less urgent
than p), so tokens a summary leaves out count ahead of every request: a report without a summary
places none, and every request waits behind all of its queue (the estimate from before
priorities). MOST_URGENT keys work that every new request waits behind whatever its priority:
prompts a node's scheduler already started in chunks and serves before admitting anyone (fcfs,
lpm), and a part that reports no priorities (`placed`).
"""
from __future__ import annotations

from collections.abc import Iterable

from raypd.protocol.sampling_params import PRIORITY_BOUND

QueuedByPriority = tuple[tuple[int, int], ...]

# Enough for every level of a deployment's classes plus MOST_URGENT, in under 100 bytes a report.
MAX_LEVELS = 8
MOST_URGENT = -PRIORITY_BOUND   # no request is more urgent: work keyed here is ahead of every request
LEAST_URGENT = PRIORITY_BOUND   # no request is less urgent: a request here waits behind the whole queue


def summarize(pairs: Iterable[tuple[int, int]], max_levels: int = MAX_LEVELS) -> QueuedByPriority:
    """(priority, tokens) pairs, in any order and with repeats, as the bounded summary."""
    by_priority: dict[int, int] = {}
    for priority, tokens in pairs:
        if tokens > 0:
            by_priority[priority] = by_priority.get(priority, 0) + tokens
    levels = sorted(by_priority.items())
    if len(levels) > max_levels:
        folded = levels[max_levels - 1:]
        levels = [*levels[:max_levels - 1], (folded[0][0], sum(t for _, t in folded))]
    return tuple(levels)


def placed(summary: QueuedByPriority, total: int) -> QueuedByPriority:
    """The summary with the tokens of `total` it leaves out counted ahead of every request."""
    unplaced = total - sum(t for _, t in summary)
    return summarize([(MOST_URGENT, unplaced), *summary]) if unplaced > 0 else summary


def tokens_behind(summary: QueuedByPriority, priority: int) -> int:
    """Queued tokens a new request at `priority` overtakes: those less urgent than it. What it waits
    behind is the queue's total less these, so tokens a summary leaves out count ahead of everyone."""
    return sum(t for p, t in summary if p > priority)
