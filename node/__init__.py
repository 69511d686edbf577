"""What every node actor shares (the node core: engine thread, token streams, KV events, host, metrics) and MixedNode; map in docs/architecture.md."""
