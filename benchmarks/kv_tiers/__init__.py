"""The KV tiers below the pool measured on one engine, outside `raypd bench serve`; map in docs/architecture.md."""
