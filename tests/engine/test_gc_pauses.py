"""engine/gc_pauses.py: the start-up heap frozen out of the collector's walks, undone by thaw_heap;
every collection's pause recorded with its generation while recording, none after."""
from __future__ import annotations

import gc

from raypd.engine.gc_pauses import GcPauses, freeze_heap, thaw_heap


def test_freeze_moves_the_heap_out_of_the_collector_and_thaw_brings_it_back():
    assert gc.get_freeze_count() == 0  # nothing in the suite's process is frozen
    try:
        frozen = freeze_heap()
        # At most what was frozen: another thread of this pytest worker (tqdm's monitor, say) may free
        # a frozen object meanwhile, which takes it out of the count.
        assert frozen >= gc.get_freeze_count() > 1000
        # A full collection now walks only what is not frozen: a small part of the heap.
        assert len(gc.get_objects(generation=2)) < frozen // 10
    finally:
        thaw_heap()
    assert gc.get_freeze_count() == 0


def test_every_collection_is_recorded_with_its_generation_while_recording():
    with GcPauses() as pauses:
        gc.collect(0)
        gc.collect(2)
    gc.collect(2)  # after the block: not recorded
    assert [g for g, _ in pauses.pauses][-2:] == [0, 2] and all(s >= 0 for _, s in pauses.pauses)
    summary = pauses.summary()
    assert summary["full_collections"] == 1 and summary["collections"] == len(pauses.pauses)
    assert summary["max_ms"] >= summary["full_max_ms"] > 0
