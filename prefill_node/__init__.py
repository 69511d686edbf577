"""PrefillNode, the Ray actor computing prompts and writing their KV into decode nodes, and its queue stages; map in docs/architecture.md."""
