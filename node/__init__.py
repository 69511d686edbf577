"""What every node actor shares: the engine thread, token streams to callers, host identity, the
messages, and MixedNode (prefill and decode on one actor, the colocated baseline).

| module          | one sentence |
|-----------------|--------------|
| messages.py     | dataclasses that cross actor boundaries: NodeRequest, TokenChunk (and its msgpack wire form), StreamEnd, PrefillResult, LoadReport, HostInfo |
| engine_loop.py  | EngineLoop: the one thread that owns the LLMEngine; other threads hand it calls |
| streams.py      | TokenStreams: tokens to callers over pyzmq, one msgpack message per engine step per caller; Reply: a one-shot answer to the event loop |
| host.py         | host_info(): the Ray node id and IP an actor runs on |
| aux_slots.py    | the per-request aux record (first token, cached tokens, prompt length) and its slot pool |
| node_base.py    | NodeBase: engine + loop + streams + KV events + load report, shared by every role |
| mixed_node.py   | MixedNode: one engine doing prefill and decode, streaming tokens |
"""
