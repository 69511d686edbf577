"""SLO-driven autoscaling of the node pool: what `raypd serve --autoscale` decides, pure and clock-free, for the NodePool to carry out (docs/architecture.md, cluster/)."""
