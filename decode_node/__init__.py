"""DecodeNode: a Ray actor receiving prompts' KV from prefill nodes and decoding them (decode_node.py)."""
