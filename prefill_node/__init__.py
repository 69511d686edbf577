"""PrefillNode: a Ray actor computing prompts and writing their KV into decode nodes (prefill_node.py)."""
