"""A node's KV events wait for the Conductor link in a bounded buffer: with no Conductor to drain it
(`raypd generate` without one, a Conductor away for long) the oldest go, never memory without end,
and what is left is a contiguous run ending at the cache's latest event, so the Conductor sees the
gap and re-reads the cache from a snapshot. In this process, no Ray."""
from __future__ import annotations

import asyncio

from raypd.node import node_core
from raypd.node.mixed_node import MixedNode
from raypd.protocol.sampling_params import SamplingParams
from tests.node.pd import prompt, request

BUFFER = 4


def test_the_event_buffer_keeps_the_latest_events_and_no_more(monkeypatch):
    monkeypatch.setattr(node_core, "KV_EVENT_BUFFER", BUFFER)

    async def run():
        node = MixedNode("events", engine_options={"num_blocks": 64})
        try:
            params = SamplingParams(max_tokens=2, temperature=0.0)
            for i in range(8):  # distinct 40-token prompts: each stores its blocks in the cache
                await node.generate(request(prompt(40, 1000 + 100 * i), params))
            batch = await node.drain_kv_events()
            seqs = [e.seq for e in batch.events]
            last_seq, _ = await node.kv_snapshot()
            return seqs, last_seq, (await node.drain_kv_events()).events
        finally:
            await node.shutdown()
    seqs, last_seq, after = asyncio.run(run())
    assert len(seqs) == BUFFER and seqs == list(range(seqs[0], seqs[0] + BUFFER))
    assert seqs[-1] == last_seq and seqs[0] > 1   # the oldest were dropped: a gap before seqs[0]
    assert after == ()
