"""untracked(): an actor method call that leaves no record in Ray's task table.

Ray stores an event for every actor call in the GCS (up to RAY_task_events_max_num_task_in_gcs,
100,000 by default) so the dashboard can list tasks. raypd makes many small calls: per request
(route, prefill, generate, abort) and periodically (health probes, load reports, KV event batches).
In a 10-minute soak they grew the GCS by ~3.3 MiB/min (+43% RSS) towards that cap, and each one is
GCS work. Those calls go through untracked(); raypd's own metrics and /admin/nodes say what they
did. Rare calls (start-up, attach, mark_dead, prefix copies) stay visible, and calls through a Serve
deployment handle (the ingress's membership refresh) are Serve's to record.
"""
from __future__ import annotations

from typing import Any


def untracked(method: Any) -> Any:
    """`method` (an actor method handle) with Ray's task events off. A stand-in without `.options`
    (a unit test's fake handle) is returned as it is."""
    options = getattr(method, "options", None)
    return method if options is None else options(enable_task_events=False)
