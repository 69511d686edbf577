"""The engine publishes KV events whose hashes are the shared chained block hash."""
from __future__ import annotations

from raypd.engine import LLMEngine, SamplingParams
from raypd.protocol.block_hash import chained_block_hashes
from raypd.protocol.kv_events import BlockRemoved, BlockStored


def test_events_name_the_prompt_blocks():
    events = []
    eng = LLMEngine(None, on_kv_event=events.append, num_blocks=12, block_size=16)
    prompt = list(range(300, 300 + 70))
    rid = eng.add_request(prompt, SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
    while eng.has_unfinished():
        eng.step()
    stored = [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]
    # Prompt blocks, then the block completed by output tokens at finish.
    full = chained_block_hashes(prompt, 16)
    assert len(full) == 4 and stored[:4] == full
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    # A second long request evicts the first one's blocks and says so.
    eng.add_request(list(range(5000, 5000 + 150)), SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
    while eng.has_unfinished():
        eng.step()
    removed = {h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes}
    assert removed & set(full)
    eng.check_block_integrity()
    assert rid not in eng.requests
