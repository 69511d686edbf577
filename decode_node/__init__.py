"""DecodeNode, the Ray actor receiving prompts' KV from prefill nodes and decoding them, and its queue stages; map in docs/architecture.md."""
