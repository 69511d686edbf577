"""The KV tiers' own figures in `raypd bench serve`: the nodes' tier totals read before and after a run; map in docs/architecture.md."""
