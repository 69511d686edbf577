"""`raypd bench autoscale`: a load step (base rate, three times it, base again) on `raypd serve
--autoscale`, SLO attainment over time beside the node pool's size per role; map in docs/architecture.md."""
