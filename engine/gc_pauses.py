"""The cyclic garbage collector's pauses on a serving process: keep them short, and measure them.

Why: a full (generation 2) collection walks every tracked object in the process. After torch, the
model and (in benchmarks) transformers are imported and loaded that is millions of objects, and
the walk stalls the engine thread for 0.1-1 s: a step that should take 2 ms takes hundreds, seen as
a TTFT or inter-token outlier. Nearly all of those objects live as long as the process, so after
start-up they are moved out of the collector's reach (gc.freeze, as vLLM's engine core does after
its start): later collections walk only what was made since, in milliseconds.

The cost: a reference cycle among frozen objects is never collected, even once it is garbage. So
only a process that builds its engine once and serves with it until it exits freezes: a node actor
in its own Ray worker process (node/node_core.py), a benchmark between its engines (it thaws before
building the next one). A process that builds and drops engines one after another (the tests, a
user's script with raypd.engine.LLM) does not.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field


def freeze_heap() -> int:
    """Collect, then move every object alive now into the collector's permanent generation.
    Returns how many objects are frozen in all."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def thaw_heap() -> None:
    """Undo freeze_heap (a benchmark before it drops one engine and builds another) and collect."""
    gc.unfreeze()
    gc.collect()


@dataclass(slots=True)
class GcPauses:
    """Every collection while recording: its generation and how long it held the interpreter.
    A context manager: `with GcPauses() as pauses: ...`; not reentrant."""
    pauses: list[tuple[int, float]] = field(default_factory=list)
    _started: float = 0.0

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._on_collection)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._on_collection)

    def _on_collection(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._started))

    def summary(self) -> dict[str, float | int]:
        """Count, total and longest pause, overall and of full (generation 2) collections."""
        full = [s for g, s in self.pauses if g == 2]
        every = [s for _, s in self.pauses]
        return {"collections": len(every), "total_ms": 1e3 * sum(every), "max_ms": 1e3 * max(every, default=0.0),
                "full_collections": len(full), "full_total_ms": 1e3 * sum(full),
                "full_max_ms": 1e3 * max(full, default=0.0)}
