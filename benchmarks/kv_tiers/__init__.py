"""The KV tiers below the pool, measured outside `raypd bench serve` (engine/cache/kv_tiers.py)."""
